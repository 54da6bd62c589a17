"""`POST /api/compute/<group>/<method>`: validate, draft, decide once, run, answer one envelope."""

from __future__ import annotations

import json
import logging
import threading
import time
from typing import Any

from django.db import connection
from django.http import HttpRequest, JsonResponse
from rest_framework.request import Request
from rest_framework.views import APIView

from audit.context import stamped
from compute.core.api.inputs import Input, first_error
from compute.core.api.registry import REGISTRY, CallContext, Endpoint
from compute.core.db import connection_lost
from compute.core.errors import InvalidArgument, NotFound
from compute.core.metrics import API_REQUESTS, API_SECONDS
from compute.http.auth import authenticate
from compute.http.edge import (
    CALLER,
    acting_as,
    decide_once,
    error_answer,
    new_request_id,
    probe_recorded,
    respond,
)
from compute.platform.iam.calls import call_slot
from compute.platform.tenancy.models import Principal

REQUESTS_LOG = logging.getLogger("compute.requests")


class EnvelopeView(APIView):
    authentication_classes: list[type] = []
    permission_classes: list[type] = []

    def post(self, request: Request, group: str, method: str) -> JsonResponse:
        request_id = new_request_id()
        began = time.perf_counter()
        CALLER.set(None)
        response = respond(request_id, lambda: self._call(request, group, method, request_id))
        seen(f"{group}.{method}" if (group, method) in REGISTRY else "unknown",
             response, time.perf_counter() - began)
        return response

    def perform_authentication(self, request: Request) -> None:
        """The envelope authenticates itself (compute.http.auth); DRF's pass would replace
        the session user on the underlying request with an anonymous one."""

    def handle_exception(self, exc: Exception) -> JsonResponse:  # type: ignore[override]
        """What DRF refuses before `post` runs (such as another HTTP method)."""
        status, body = error_answer(exc, new_request_id())
        return JsonResponse(body, status=status)

    def _call(self, request: Request, group: str, method: str, request_id: str) -> Any:
        endpoint = REGISTRY.get((group, method))
        try:
            return self._once(request, group, method, request_id)
        except Exception as error:
            if endpoint is None or endpoint.mutating or not connection_lost(error):
                raise
            # A read is safe to run again: once, on a new connection (a failover, a
            # restarted server, a killed session); a write answers `unavailable` and its
            # caller retries it with its idempotency key.
            connection.close()
            return self._once(request, group, method, request_id)

    def _once(self, request: Request, group: str, method: str, request_id: str) -> Any:
        django_request: HttpRequest = request._request
        principal = authenticate(django_request.headers,
                                 session=getattr(django_request, "session", None),
                                 user=getattr(django_request, "user", None),
                                 address=django_request.META.get("REMOTE_ADDR") or "")
        if not django_request.body.strip():
            raise InvalidArgument("the body must be a JSON object ({} when there is nothing "
                                  "to send)")
        body = request.data
        if not isinstance(body, dict):
            raise InvalidArgument("body must be a JSON object")
        return call(principal, f"{group}.{method}", dict(body), request_id)


def seen(method: str, response: JsonResponse, seconds: float) -> None:
    """Count, time and log one envelope call: a JSON line per request on `compute.requests`."""
    API_REQUESTS.labels(method=method, status=str(response.status_code)).inc()
    API_SECONDS.labels(method=method).observe(seconds)
    principal_id, tenant_id = CALLER.get() or (None, None)
    REQUESTS_LOG.info(json.dumps({
        "requestId": response["X-Request-Id"], "method": method,
        "status": response.status_code, "durationMs": round(seconds * 1000, 1),
        "principal": principal_id, "tenant": tenant_id}))


def call(principal: Principal, action: str, body: dict[str, Any], request_id: str) -> Any:
    """One API call by an authenticated principal: the tenant it acts in, its input checked,
    decided once by IAM, then run. The envelope and the console's pages both call this."""
    group, _, method = action.partition(".")
    endpoint = REGISTRY.get((group, method))
    if endpoint is None:
        raise NotFound(f"unknown method {action}", method=action)
    if (where := unstorable(body)) is not None:
        raise InvalidArgument(f"{where}: has a NUL character or a lone surrogate",
                              field=where)
    who = acting_as(principal, tenant_ref=body.pop("tenantId", None), request_id=request_id,
                    action=endpoint.action)
    data = validate(endpoint, body)
    ctx = CallContext(principal=who.principal, tenant=who.tenant, request_id=request_id)
    with call_slot(principal_id=who.principal.id, tenant_id=who.tenant.id):
        try:
            resource = endpoint.draft(ctx, data)
        except NotFound as missing:
            probe_recorded(who.principal, request_id=request_id, action=endpoint.action,
                           target=str(next(iter(missing.details.values()), "")),
                           reason=f"not found in tenant {who.tenant.id}")
            raise
        stamp = decide_once(who, endpoint.action, resource)
        with stamped(stamp):
            return endpoint.handler(ctx, data)


def unstorable(value: Any, path: str = "") -> str | None:
    """The path of the first string (key or value) Postgres cannot store as text: one with a
    NUL, or a lone surrogate (not UTF-8); None when there is none."""
    if isinstance(value, str):
        return (path or "body") if "\x00" in value or not _encodable(value) else None
    if isinstance(value, dict):
        for key, item in value.items():
            where = f"{path}.{key}" if path else str(key)
            if not _encodable(str(key)) or "\x00" in str(key):
                return path or "body"
            if (found := unstorable(item, where)) is not None:
                return found
    if isinstance(value, list):
        for index, item in enumerate(value):
            if (found := unstorable(item, f"{path}[{index}]")) is not None:
                return found
    return None


def _encodable(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def validate(endpoint: Endpoint, body: dict[str, Any]) -> dict[str, Any]:
    serializer = _input_for(endpoint.input, body)
    if not serializer.is_valid():
        field, message = first_error(serializer.errors)
        raise InvalidArgument(f"{field}: {message}" if field else message, field=field or None)
    return dict(serializer.validated_data)


_inputs = threading.local()


def _input_for(input_class: type[Input], body: dict[str, Any]) -> Input:
    """This thread's instance of `input_class`, ready to validate `body`. A serializer
    deep-copies (rebuilds) every declared field each time one is made, a large part of a
    booking's cost; its bound fields keep no state between validations, so a thread keeps
    one instance per input and clears what the last call left on it."""
    kept: dict[type[Input], Input] = _inputs.__dict__.setdefault("kept", {})
    serializer = kept.get(input_class)
    if serializer is None:
        serializer = kept[input_class] = input_class()
        _ = serializer.fields  # bound once
    for leftover in ("_validated_data", "_errors", "_data"):
        serializer.__dict__.pop(leftover, None)
    serializer.initial_data = body
    return serializer
