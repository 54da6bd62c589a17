import contextlib
from importlib import import_module
from importlib.util import find_spec
from pathlib import Path

from django.apps import AppConfig, apps
from django.conf import settings

# compute's own event types and role grants, declared beside its API modules.
VOCABULARY = ("compute.tenancy.events", "compute.tenancy.grants", "compute.events.grants")


class ComputeConfig(AppConfig):
    name = "compute"
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
                if config.name != "compute" and find_spec(f"{config.name}.{part}") is not None:
                    import_module(f"{config.name}.{part}")
        for module in ("compute.tenancy.api", "compute.events.api"):
            import_module(module)
        for config in apps.get_app_configs():
            name = f"{config.name}.api"
            if config.name != "compute" and find_spec(name) is not None:
                import_module(name)
