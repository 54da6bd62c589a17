"""GET /.well-known/better-compute: what agents and verifiers need to trust this control plane.

Each app may contribute keys from its own `wellknown.py` (a `contribute()` returning a
dict), discovered like the API modules.
"""

from __future__ import annotations

from collections.abc import Callable
from importlib import import_module
from importlib.util import find_spec
from typing import Any

from django.apps import apps
from django.conf import settings
from django.http import HttpRequest, JsonResponse
from django.views.decorators.http import require_GET

Contributor = Callable[[], dict[str, Any]]


def contributors() -> list[Contributor]:
    found = []
    for config in apps.get_app_configs():
        name = f"{config.name}.wellknown"
        if config.name != "compute" and find_spec(name) is not None:
            found.append(import_module(name).contribute)
    return found


def document() -> dict[str, Any]:
    doc: dict[str, Any] = {
        "version": 1,
        # Every session gateway; gatewayUrl, the first, for agents before 0.2.
        "gatewayUrl": settings.BC_GATEWAY_URLS[0] if settings.BC_GATEWAY_URLS else None,
        "gatewayUrls": settings.BC_GATEWAY_URLS,
        "gatewayJoinUrl": settings.BC_GATEWAY_JOIN_URL or None,
    }
    for contribute in contributors():
        doc.update(contribute())
    return doc


@require_GET
def wellknown_view(request: HttpRequest) -> JsonResponse:
    return JsonResponse(document())
