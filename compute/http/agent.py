"""The agent-facing HTTP endpoints the gateway relays to (no IAM, no session):

- POST /api/agent/join {sealedToken, csr (base64 DER), hardware}: the signed join document,
  or 403 `join_refused` whatever the reason (the audit trail has it);
- POST /api/agent/renew {nodeId, csr}: a new certificate for the node's own key.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from compute.core.errors import InvalidArgument
from compute.http.edge import new_request_id, respond
from fleet.services.join import Hardware, join_redeem, node_certificate_renew


def _body(request: HttpRequest, what: str) -> dict[str, Any]:
    try:
        body = json.loads(request.body)
    except ValueError:
        raise InvalidArgument(f"malformed {what}: not JSON") from None
    if not isinstance(body, dict):
        raise InvalidArgument(f"malformed {what}: not a JSON object")
    return body


def _field(body: dict[str, Any], name: str, what: str) -> str:
    value = body.get(name)
    if not isinstance(value, str) or not value:
        raise InvalidArgument(f"malformed {what}: {name} must be a string", field=name)
    return value


def _der(body: dict[str, Any], what: str) -> bytes:
    try:
        return base64.b64decode(_field(body, "csr", what), validate=True)
    except binascii.Error:
        raise InvalidArgument(f"malformed {what}: csr is not base64", field="csr") from None


def _hardware(body: dict[str, Any]) -> Hardware:
    hardware = body.get("hardware") or {}
    macs = hardware.get("macs", []) if isinstance(hardware, dict) else None
    if not isinstance(hardware, dict) or not isinstance(macs, list):
        raise InvalidArgument("malformed join request: hardware", field="hardware")
    return Hardware(hostname=str(hardware.get("hostname", "")),
                    serial=str(hardware.get("serial", "")),
                    product_uuid=str(hardware.get("productUuid", "")),
                    macs=tuple(str(m) for m in macs))


@csrf_exempt
@require_POST
def join_view(request: HttpRequest) -> JsonResponse:
    def join() -> dict[str, str]:
        body = _body(request, "join request")
        return join_redeem(sealed_token=_field(body, "sealedToken", "join request"),
                           csr_der=_der(body, "join request"), hardware=_hardware(body))

    return respond(new_request_id(), join)


@csrf_exempt
@require_POST
def renew_view(request: HttpRequest) -> JsonResponse:
    def renew() -> dict[str, str]:
        body = _body(request, "renewal")
        return {"certificatePem": node_certificate_renew(
            node_id=_field(body, "nodeId", "renewal"), csr_der=_der(body, "renewal"))}

    return respond(new_request_id(), renew)
