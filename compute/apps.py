from importlib import import_module
from importlib.util import find_spec

from django.apps import AppConfig, apps


class ComputeConfig(AppConfig):
    name = "compute"
    verbose_name = "Compute: tenants, IAM, events"

    def ready(self) -> None:
        """Discover every app's `api.py` (and compute's own API modules), as the admin does."""
        for module in ("compute.tenancy.api", "compute.events.api"):
            import_module(module)
        for config in apps.get_app_configs():
            name = f"{config.name}.api"
            if config.name != "compute" and find_spec(name) is not None:
                import_module(name)
