import contextlib
from importlib import import_module
from importlib.util import find_spec
from pathlib import Path

from django.apps import AppConfig, apps
from django.conf import settings

# compute's own event types and role grants, declared beside its API modules.
VOCABULARY = ("compute.platform.tenancy.events", "compute.platform.tenancy.grants",
              "compute.platform.events.grants")


class ComputeConfig(AppConfig):
    name = "compute.platform"
    label = "compute"  # its tables and migrations keep the name they have always had
    verbose_name = "Compute: tenants, IAM, events"

    def ready(self) -> None:
        """Collect every app's event types (`events.py`) and role grants (`grants.py`), then
        discover its `api.py` (and compute's own API modules), as the admin does."""
        with contextlib.suppress(OSError):  # WhiteNoise serves collectstatic's output from here
            Path(settings.STATIC_ROOT).mkdir(parents=True, exist_ok=True)
        for module in VOCABULARY:
            import_module(module)
        for config in apps.get_app_configs():  # first what every app declares, then its API
            for part in ("events", "grants"):
                if config.name != self.name and find_spec(f"{config.name}.{part}") is not None:
                    import_module(f"{config.name}.{part}")
        for module in ("compute.platform.tenancy.api", "compute.platform.events.api"):
            import_module(module)
        for config in apps.get_app_configs():
            name = f"{config.name}.api"
            if config.name != self.name and find_spec(name) is not None:
                import_module(name)
