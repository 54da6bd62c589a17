"""The fleet's API groups, one module each (imported so that they register)."""

from fleet.api import images, join_tokens, nodes, pki, sites

__all__ = ["images", "join_tokens", "nodes", "pki", "sites"]
