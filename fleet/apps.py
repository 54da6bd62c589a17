from importlib import import_module
from importlib.util import find_spec

from django.apps import AppConfig, apps


class FleetConfig(AppConfig):
    name = "fleet"
    verbose_name = "Fleet: sites, pools, nodes, devices"

    def ready(self) -> None:
        """Collect the node report kinds each app applies (its `reports.py`) and what of
        each app holds a node (its `holders.py`)."""
        for config in apps.get_app_configs():
            for part in ("reports", "holders"):
                if find_spec(f"{config.name}.{part}") is not None:
                    import_module(f"{config.name}.{part}")
