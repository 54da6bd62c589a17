"""The agent-facing HTTP endpoints the gateway relays to (no IAM, no session):

- POST /api/agent/join {sealedToken, csr (base64 DER), hardware}: the signed join document,
  or 403 `join_refused` whatever the reason;
- POST /api/agent/renew {nodeId, csr}: a new certificate for the node's own key.
"""

from __future__ import annotations

import base64
import binascii
import functools
import json
from collections.abc import Callable
from typing import Any

from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from compute.errors import ComputeError
from fleet.services.join import (
    Hardware,
    JoinRefused,
    RenewRefused,
    join_redeem,
    node_certificate_renew,
)


def agent_endpoint(refused: type[ComputeError], what: str
                   ) -> Callable[[Callable[[dict[str, Any]], Any]], Callable[..., JsonResponse]]:
    """Parse the JSON body, run `handler`, and answer the envelope: 400 for a malformed
    body, 403 for a refusal (with no reason: the audit trail has it)."""

    def wrap(handler: Callable[[dict[str, Any]], Any]) -> Callable[..., JsonResponse]:
        @csrf_exempt
        @require_POST
        @functools.wraps(handler)
        def view(request: HttpRequest) -> JsonResponse:
            try:
                result = handler(json.loads(request.body))
            except (ValueError, KeyError, TypeError, binascii.Error):
                error, status = {"code": "invalid_argument", "message": f"malformed {what}"}, 400
            except refused as refusal:
                error, status = {"code": refusal.code, "message": refusal.message}, 403
            else:
                return JsonResponse({"ok": True, "result": result})
            return JsonResponse({"ok": False, "error": error}, status=status)

        return view

    return wrap


@agent_endpoint(JoinRefused, "join request")
def join_view(body: dict[str, Any]) -> dict[str, str]:
    hardware = body.get("hardware") or {}
    return join_redeem(
        sealed_token=str(body["sealedToken"]), csr_der=base64.b64decode(body["csr"]),
        hardware=Hardware(hostname=str(hardware.get("hostname", "")),
                          serial=str(hardware.get("serial", "")),
                          product_uuid=str(hardware.get("productUuid", "")),
                          macs=tuple(str(m) for m in hardware.get("macs", []))))


@agent_endpoint(RenewRefused, "renewal")
def renew_view(body: dict[str, Any]) -> dict[str, str]:
    return {"certificatePem": node_certificate_renew(node_id=str(body["nodeId"]),
                                                     csr_der=base64.b64decode(body["csr"]))}
