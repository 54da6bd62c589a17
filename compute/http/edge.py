"""The one edge between HTTP and the control plane, shared by every entry point (the
envelope, the events watch stream, the agent-facing join and renew endpoints).

`caller()` authenticates and resolves the tenant, `decide_once()` asks IAM and writes the
denied audit row of a refusal, and `error_answer()` turns any exception into the one error
envelope: a domain error keeps its code and status, a malformed body is 400, anything else
is a logged 500 `internal` that names the request id and nothing more.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping, MutableMapping
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.core.serializers.json import DjangoJSONEncoder
from django.db import IntegrityError, connection
from django.http import JsonResponse
from rest_framework import exceptions as drf_exceptions

from audit.context import CallStamp, stamped
from bcd.contract import ids
from compute.core.api.registry import Resource
from compute.core.db import connection_lost, constraint_name
from compute.core.errors import (
    ComputeError,
    InvalidArgument,
    NotFound,
    PayloadTooLarge,
    Unavailable,
)
from compute.http.auth import authenticate
from compute.platform import iam
from compute.platform.iam.refusals import refusal_recorded
from compute.platform.tenancy.models import Principal, Tenant
from compute.platform.tenancy.selectors import tenant_resolve
from reservations.constraints import LEDGER_CONSTRAINTS

logger = logging.getLogger("compute.http")
MAX_BODY_BYTES = settings.DATA_UPLOAD_MAX_MEMORY_SIZE

# Who the current request turned out to be (principal id, tenant id), for its log line.
CALLER: ContextVar[tuple[str, str] | None] = ContextVar("caller", default=None)

@dataclass(frozen=True)
class Caller:
    """An authenticated caller acting in one tenant, under one request id."""

    principal: Principal
    tenant: Tenant
    request_id: str


def caller(headers: Mapping[str, str], *, tenant_ref: object, request_id: str, action: str,
           session: MutableMapping[str, Any] | None = None, user: Any = None,
           address: str = "") -> Caller:
    """Who calls (bearer token, or a console session with the CSRF header) and in which
    tenant (`tenant_ref`, by default the caller's own)."""
    return acting_as(authenticate(headers, session=session, user=user, address=address),
                     tenant_ref=tenant_ref, request_id=request_id, action=action)


def acting_as(principal: Principal, *, tenant_ref: object, request_id: str,
              action: str) -> Caller:
    """The caller in the tenant it names. A tenant outside its reach answers as a missing
    one, and the attempt (at either) is audited in the caller's own tenant, not in the one
    it probed."""
    CALLER.set((principal.id, principal.tenant_id))
    try:
        who = Caller(principal, tenant_resolve(tenant_ref, principal=principal), request_id)
    except NotFound:  # out of reach or missing: audited alike, so the log leaks nothing
        probe_recorded(principal, request_id=request_id, action=action, target="",
                       reason="a tenant outside the caller's reach")
        raise
    CALLER.set((principal.id, who.tenant.id))
    return who


def probe_recorded(principal: Principal, *, request_id: str, action: str, target: str,
                   reason: str) -> None:
    """A call answered 404 for what lies outside the caller's reach (or nowhere: the answer
    is the same), audited in the caller's own log and counted against its refusals."""
    with stamped(CallStamp(request_id=request_id, origin="api")):
        refusal_recorded(principal_id=principal.id, tenant_id=principal.tenant_id,
                         action=action, target=target[:64], reason=reason)


def decide_once(who: Caller, action: str, resource: Resource) -> CallStamp:
    """The request's one IAM decision (compute.platform.iam.decide_or_refuse, in the
    caller's tenant)."""
    return iam.decide_or_refuse(who.principal, action, resource, tenant_id=who.tenant.id,
                                request_id=who.request_id)


def error_answer(error: BaseException, request_id: str) -> tuple[int, dict[str, Any]]:
    """The status and envelope body of a failed request."""
    if isinstance(error, drf_exceptions.ParseError | drf_exceptions.UnsupportedMediaType):
        error = InvalidArgument(f"body is not valid JSON: {error.detail}")
    elif isinstance(error, RequestDataTooBig):
        error = PayloadTooLarge(f"the body is larger than {MAX_BODY_BYTES} bytes",
                                limit=MAX_BODY_BYTES)
    elif isinstance(error, RecursionError):  # json.loads of a body nested thousands deep
        error = InvalidArgument("body: nested too deeply")
    elif connection_lost(error):
        logger.warning("database unavailable (request %s): %s", request_id, error)
        connection.close()  # broken: the next request opens a new one
        error = Unavailable("the database does not answer; try again", retryAfterSeconds=1)
    elif isinstance(error, IntegrityError) and constraint_name(error) in LEDGER_CONSTRAINTS:
        error = LEDGER_CONSTRAINTS[constraint_name(error) or ""]()  # refused at commit
    elif isinstance(error, drf_exceptions.APIException):  # e.g. 405 for another HTTP method
        status, code = error.status_code, error.default_code
        error = ComputeError(str(error.detail))
        error.code, error.http_status = code, status  # type: ignore[misc]
    if not isinstance(error, ComputeError):
        logger.error("internal error (request %s)", request_id, exc_info=error)
        error = ComputeError("internal error", requestId=request_id)
    return error.http_status, {"ok": False, "requestId": request_id, "error": {
        "code": error.code, "message": error.message, "details": error.details}}


def respond(request_id: str, work: Callable[[], Any]) -> JsonResponse:
    """Run `work` and answer its result, or its error, as one JSON envelope."""
    try:
        body, status = {"ok": True, "result": work(), "requestId": request_id}, 200
    except Exception as error:
        status, body = error_answer(error, request_id)
    response = JsonResponse(body, encoder=DjangoJSONEncoder, status=status)
    response["X-Request-Id"] = request_id
    if wait := _retry_after(body):
        response["Retry-After"] = wait
    return response


def _retry_after(body: dict[str, Any]) -> str:
    return str((body.get("error") or {}).get("details", {}).get("retryAfterSeconds") or "")


async def send_error(send: Any, error: BaseException, request_id: str, *,
                     close: bool = False) -> None:
    """Answer an error over ASGI, as `respond` does (where Django does not answer: before
    a request has a thread, and on the event stream); `close` ends the connection after."""
    status, body = error_answer(error, request_id)
    payload = json.dumps(body, cls=DjangoJSONEncoder).encode()
    headers = [(b"content-type", b"application/json"),
               (b"content-length", str(len(payload)).encode()),
               (b"x-request-id", request_id.encode())]
    if wait := _retry_after(body):
        headers.append((b"retry-after", wait.encode()))
    if close:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": payload})


def new_request_id() -> str:
    return ids.new("req")
