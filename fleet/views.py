"""POST /api/agent/join: JoinService over HTTP, for the gateway's relay (no IAM, no session).

The body is {sealedToken, csr (base64 DER), hardware}; the answer is the signed join
document, or 403 `join_refused` whatever the reason.
"""

from __future__ import annotations

import base64
import binascii
import json

from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from fleet.services.join import (
    Hardware,
    JoinRefused,
    RenewRefused,
    join_redeem,
    node_certificate_renew,
)


@csrf_exempt
@require_POST
def join_view(request: HttpRequest) -> JsonResponse:
    try:
        body = json.loads(request.body)
        hardware = body.get("hardware") or {}
        result = join_redeem(
            sealed_token=str(body["sealedToken"]), csr_der=base64.b64decode(body["csr"]),
            hardware=Hardware(hostname=str(hardware.get("hostname", "")),
                              serial=str(hardware.get("serial", "")),
                              product_uuid=str(hardware.get("productUuid", "")),
                              macs=tuple(str(m) for m in hardware.get("macs", []))))
    except (ValueError, KeyError, TypeError, binascii.Error):
        return JsonResponse({"ok": False, "error": {"code": "invalid_argument",
                                                    "message": "malformed join request"}},
                            status=400)
    except JoinRefused as refused:
        return JsonResponse({"ok": False, "error": {"code": refused.code,
                                                    "message": refused.message}}, status=403)
    return JsonResponse({"ok": True, "result": result})


@csrf_exempt
@require_POST
def renew_view(request: HttpRequest) -> JsonResponse:
    """POST /api/agent/renew {nodeId, csr}: a new certificate for the node's own key."""
    try:
        body = json.loads(request.body)
        pem = node_certificate_renew(node_id=str(body["nodeId"]),
                                     csr_der=base64.b64decode(body["csr"]))
    except (ValueError, KeyError, TypeError, binascii.Error):
        return JsonResponse({"ok": False, "error": {"code": "invalid_argument",
                                                    "message": "malformed renewal"}},
                            status=400)
    except RenewRefused as refused:
        return JsonResponse({"ok": False, "error": {"code": refused.code,
                                                    "message": refused.message}}, status=403)
    return JsonResponse({"ok": True, "result": {"certificatePem": pem}})
