from fleet.models.pools import Pool, PoolClass
from fleet.models.sites import Site

__all__ = ["Pool", "PoolClass", "Site"]
