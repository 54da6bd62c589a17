import contextlib
from importlib import import_module
from importlib.util import find_spec
from pathlib import Path

from django.apps import AppConfig, apps
from django.conf import settings


class ComputeConfig(AppConfig):
    name = "compute"
    verbose_name = "Compute: tenants, IAM, events"

    def ready(self) -> None:
        """Discover every app's `api.py` (and compute's own API modules), as the admin does."""
        with contextlib.suppress(OSError):  # WhiteNoise serves collectstatic's output from here
            Path(settings.STATIC_ROOT).mkdir(parents=True, exist_ok=True)
        for module in ("compute.tenancy.api", "compute.events.api"):
            import_module(module)
        for config in apps.get_app_configs():
            name = f"{config.name}.api"
            if config.name != "compute" and find_spec(name) is not None:
                import_module(name)
