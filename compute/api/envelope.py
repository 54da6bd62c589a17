"""`POST /api/compute/<group>/<method>`: validate, draft, decide once, run, answer one envelope."""

from __future__ import annotations

import logging
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder
from django.http import HttpRequest, JsonResponse
from rest_framework import exceptions as drf_exceptions
from rest_framework.request import Request
from rest_framework.views import APIView

from audit.context import CallStamp, stamped
from audit.services import audit_denied
from bcd.contract import ids
from compute import iam
from compute.api.auth import authenticate
from compute.api.inputs import first_error
from compute.api.registry import REGISTRY, CallContext, Endpoint
from compute.errors import ComputeError, InvalidArgument, NotFound, PermissionDenied
from compute.tenancy.selectors import tenant_resolve

logger = logging.getLogger("compute.api")


def envelope_ok(result: Any, request_id: str) -> JsonResponse:
    return JsonResponse({"ok": True, "result": result, "requestId": request_id},
                        encoder=DjangoJSONEncoder, status=200)


def envelope_error(error: ComputeError, request_id: str, status: int | None = None) -> JsonResponse:
    body = {"ok": False, "requestId": request_id,
            "error": {"code": error.code, "message": error.message, "details": error.details}}
    return JsonResponse(body, encoder=DjangoJSONEncoder, status=status or error.http_status)


class EnvelopeView(APIView):
    authentication_classes: list[type] = []
    permission_classes: list[type] = []

    def post(self, request: Request, group: str, method: str) -> JsonResponse:
        request_id = ids.new("req")
        try:
            return envelope_ok(self._call(request, group, method, request_id), request_id)
        except ComputeError as error:
            return envelope_error(error, request_id)
        except (drf_exceptions.ParseError, drf_exceptions.UnsupportedMediaType) as error:
            return envelope_error(InvalidArgument(f"body is not valid JSON: {error.detail}"),
                                  request_id)
        except Exception:
            logger.exception("internal error in %s.%s (request %s)", group, method, request_id)
            return envelope_error(ComputeError("internal error", requestId=request_id),
                                  request_id)

    def perform_authentication(self, request: Request) -> None:
        """The envelope authenticates itself (compute.api.auth); DRF's pass would replace the
        session user on the underlying request with an anonymous one."""

    def handle_exception(self, exc: Exception) -> JsonResponse:  # type: ignore[override]
        status = getattr(exc, "status_code", 500)
        error = ComputeError(str(getattr(exc, "detail", "error")))
        error.code = getattr(exc, "default_code", "internal")  # type: ignore[misc]
        return envelope_error(error, ids.new("req"), status=status)

    def _call(self, request: Request, group: str, method: str, request_id: str) -> Any:
        django_request: HttpRequest = request._request
        principal = authenticate(django_request)
        endpoint = REGISTRY.get((group, method))
        if endpoint is None:
            raise NotFound(f"unknown method {group}.{method}", method=f"{group}.{method}")
        body = request.data
        if not isinstance(body, dict):
            raise InvalidArgument("body must be a JSON object")
        body = dict(body)
        tenant = tenant_resolve(body.pop("tenantId", None), principal=principal)
        data = validate(endpoint, body)
        ctx = CallContext(principal=principal, tenant=tenant, request_id=request_id)
        resource = endpoint.draft(ctx, data)
        decision = iam.decide(principal, endpoint.action, resource,
                              {"requestId": request_id, "tenantId": tenant.id})
        stamp = CallStamp(request_id=request_id, decision_id=decision.id,
                          decision_reason=decision.reason, origin="api")
        with stamped(stamp):
            if not decision.allowed:
                audit_denied(tenant_id=tenant.id, actor_id=principal.id,
                             action=endpoint.action, target=resource.id or "",
                             reason=decision.reason)
                raise PermissionDenied(f"not allowed: {decision.reason}",
                                       action=endpoint.action, decisionId=decision.id)
            return endpoint.handler(ctx, data)


def validate(endpoint: Endpoint, body: dict[str, Any]) -> dict[str, Any]:
    serializer = endpoint.input(data=body)
    if not serializer.is_valid():
        field, message = first_error(serializer.errors)
        raise InvalidArgument(f"{field}: {message}" if field else message, field=field or None)
    return dict(serializer.validated_data)
