"""Signing in and out, and what every console page shares: the signed-in principal, the
tenant it looks at, its calls through the envelope's path, and what it may do."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.contrib import auth
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from compute.core import secrets
from compute.core.api.registry import Resource
from compute.core.errors import ComputeError, Unauthenticated
from compute.http.auth import SESSION_TOKEN_KEY, session_principal
from compute.http.edge import Caller, acting_as, decide_once, new_request_id
from compute.http.envelope import call
from compute.platform import iam
from compute.platform.iam import oidc
from compute.platform.tenancy.models import ROOT_TENANT_SLUG, TOKEN_SCHEME, Principal, Tenant
from compute.platform.tenancy.selectors import principal_for_token, principal_for_user

SIGN_IN = "/console/sign-in"


@require_http_methods(["GET", "POST"])
def sign_in(request: HttpRequest) -> HttpResponse:
    """An API token pasted once (the session keeps only its id), or a Django user's name and
    password (the user must have a principal)."""
    error = ""
    if request.method == "POST":
        try:
            _sign_in(request)
        except Unauthenticated as refused:
            error = refused.message
        else:
            return HttpResponseRedirect("/console/")
    return render(request, "console/sign_in.html", {"error": error,
                                                    "oidc": oidc.configured()},
                  status=401 if error else 200)


def _sign_in(request: HttpRequest) -> None:
    presented = request.POST.get("token", "").strip()
    if presented:
        principal_for_token(presented)
        token_id, _ = secrets.split(TOKEN_SCHEME, presented) or ("", "")
        request.session.cycle_key()  # a new session id for the signed-in browser
        request.session[SESSION_TOKEN_KEY] = token_id
        return
    user = auth.authenticate(request, username=request.POST.get("username", ""),
                             password=request.POST.get("password", ""))
    if user is None:
        raise Unauthenticated("paste an API token, or a user name and password that match")
    principal_for_user(user)
    auth.login(request, user)  # cycles the session key too


@require_POST
def sign_out(request: HttpRequest) -> HttpResponse:
    """Ends the session: the cookie no longer stands for anyone (the token itself lives on)."""
    auth.logout(request)  # flushes the session, token id included
    return HttpResponseRedirect(SIGN_IN)


@dataclass(frozen=True)
class Page:
    """One console request: who is signed in, which tenant it looks at, and its calls."""

    request: HttpRequest
    principal: Principal
    tenant: Tenant
    request_id: str

    def call(self, action: str, **body: Any) -> Any:
        """The API method, exactly as the envelope runs it (IAM decides once)."""
        return call(self.principal, action, {**body, "tenantId": self.tenant.id},
                    self.request_id)

    def decide(self, action: str) -> None:
        """Refuse the page, audited, unless IAM allows `action` (pages with no API read)."""
        decide_once(Caller(self.principal, self.tenant, self.request_id), action,
                    Resource(kind=action.partition(".")[0], tenant_id=self.tenant.id))

    def can(self, action: str) -> bool:
        """Whether IAM would allow `action` here: pages show only the actions it allows
        (the envelope still decides each one when it is made)."""
        resource = Resource(kind=action.partition(".")[0], tenant_id=self.tenant.id)
        return iam.decide(self.principal, action, resource).allowed

    @property
    def is_root(self) -> bool:
        return self.principal.tenant.slug == ROOT_TENANT_SLUG

    def render(self, template: str, context: dict[str, Any], *,
               status: int = 200) -> HttpResponse:
        return render(self.request, template, {"page": self, "principal": self.principal,
                                               "tenant": self.tenant, **context},
                      status=status)


def console_page(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """A page for the signed-in principal (others go to sign in), in its own tenant or the
    one `?tenant=` names; a refused call renders the envelope's message with its status."""

    @require_GET
    @functools.wraps(view)
    def page(request: HttpRequest, **kwargs: Any) -> HttpResponse:
        try:
            principal = session_principal(request.session, request.user)
        except Unauthenticated:
            return HttpResponseRedirect(SIGN_IN)
        request_id = new_request_id()
        try:
            who = acting_as(principal, tenant_ref=request.GET.get("tenant") or None,
                            request_id=request_id, action="console.view")
            current = Page(request, principal, who.tenant, request_id)
            return view(request, current, **kwargs)
        except ComputeError as refused:
            return render(request, "console/refused.html",
                          {"message": refused.message, "principal": principal},
                          status=refused.http_status)

    return page
