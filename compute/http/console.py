"""The operator console at /console/: sign in with an API token, then the fleet board.

The session stands for the token's principal: it stores the token's *id* only (never its
secret), and every page re-checks that token, so a revoked or expired token signs the
browser out. Every page is decided by IAM like the API call it mirrors (`nodes.list`).
"""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.utils import timezone
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from compute import secrets
from compute.api.registry import Resource
from compute.errors import ComputeError, Unauthenticated
from compute.events.selectors import event_list
from compute.events.serializers import present_event
from compute.http.edge import Caller, decide_once, new_request_id
from compute.tenancy.models import TOKEN_SCHEME, ApiToken, Principal
from compute.tenancy.selectors import principal_for_token
from reservations.board import fleet_board

SESSION_KEY = "console_token_id"


def _signed_in(request: HttpRequest) -> Principal | None:
    token_id = request.session.get(SESSION_KEY)
    token = (ApiToken.objects.select_related("principal__tenant")
             .filter(pk=token_id, revoked_at__isnull=True).first() if token_id else None)
    if token is None or (token.expires_at is not None and token.expires_at <= timezone.now()) \
            or token.principal.disabled_at is not None:
        request.session.pop(SESSION_KEY, None)
        return None
    return token.principal


@require_http_methods(["GET", "POST"])
def sign_in(request: HttpRequest) -> HttpResponse:
    error = ""
    if request.method == "POST":
        presented = request.POST.get("token", "").strip()
        try:
            principal_for_token(presented)
        except Unauthenticated as refused:
            error = refused.message
        else:
            token_id, _ = secrets.split(TOKEN_SCHEME, presented) or ("", "")
            request.session.cycle_key()  # a new session id for the signed-in browser
            request.session[SESSION_KEY] = token_id
            return HttpResponseRedirect("/console/")
    return render(request, "console/sign_in.html", {"error": error},
                  status=401 if error else 200)


@require_POST
def sign_out(request: HttpRequest) -> HttpResponse:
    request.session.flush()
    return HttpResponseRedirect("/console/sign-in")


@require_GET
def board(request: HttpRequest) -> HttpResponse:
    principal = _signed_in(request)
    if principal is None:
        return HttpResponseRedirect("/console/sign-in")
    who = Caller(principal, principal.tenant, new_request_id())
    try:
        decide_once(who, "nodes.list", Resource(kind="nodes", tenant_id=who.tenant.id))
    except ComputeError as refused:
        return render(request, "console/refused.html", {"message": refused.message},
                      status=refused.http_status)
    events = [present_event(e) for e in event_list(tenant=who.tenant, since=0, limit=1000)]
    return render(request, "console/board.html", {
        "principal": principal, "tenant": who.tenant, "board": fleet_board(tenant=who.tenant),
        "events": list(reversed(events[-20:]))})
