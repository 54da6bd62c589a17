"""Console sign-in with OpenID Connect: the authorization code flow with PKCE.

`/console/sign-in/oidc` sends the browser to the issuer with a fresh state, nonce and code
challenge kept in the session; the issuer sends it back to `…/callback` with a code, which
is exchanged (with the verifier) for an ID token. The ID token is verified as any OIDC
bearer token is (compute.platform.iam.oidc: keys, issuer, audience, expiry), its nonce must
be the session's, and its groups give the principal's roles. The session lasts as long as
the ID token: it ends when the IdP's token does.
"""

from __future__ import annotations

import secrets
from urllib.parse import urlencode

from django.conf import settings
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.views.decorators.http import require_GET

from compute.core.errors import ComputeError, Unauthenticated
from compute.core.pkce import pkce_pair
from compute.http.auth import SESSION_OIDC
from compute.platform.iam import oidc
from compute.platform.tenancy.services import oidc_principal

SESSION_FLOW = "console_oidc_flow"  # the state, nonce and verifier of a sign-in under way
CALLBACK = "/console/sign-in/oidc/callback"


@require_GET
def oidc_start(request: HttpRequest) -> HttpResponse:
    if not oidc.configured():
        return HttpResponseRedirect("/console/sign-in")
    try:
        authorize = oidc.discovery()["authorization_endpoint"]
    except (ComputeError, KeyError) as error:
        return _refused(request, str(getattr(error, "message", error)))
    verifier, challenge = pkce_pair()
    flow = {"state": secrets.token_urlsafe(24), "nonce": secrets.token_urlsafe(24),
            "verifier": verifier}
    request.session[SESSION_FLOW] = flow
    query = {"response_type": "code", "client_id": oidc.accepted_audiences()[0],
             "redirect_uri": request.build_absolute_uri(CALLBACK),
             "scope": "openid email profile", "state": flow["state"],
             "nonce": flow["nonce"], "code_challenge": challenge,
             "code_challenge_method": "S256"}
    return HttpResponseRedirect(f"{authorize}?{urlencode(query)}")


@require_GET
def oidc_callback(request: HttpRequest) -> HttpResponse:
    import httpx

    flow = request.session.pop(SESSION_FLOW, None)
    if not flow or not secrets.compare_digest(request.GET.get("state", ""), flow["state"]):
        return _refused(request, "this sign-in was not started here, or was started again: "
                                 "sign in once more")
    if "code" not in request.GET:
        return _refused(request, f"the sign-in service said no: "
                                 f"{request.GET.get('error', 'no code')[:100]}")
    try:
        token_endpoint = oidc.discovery()["token_endpoint"]
        exchange = {"grant_type": "authorization_code", "code": request.GET["code"],
                    "redirect_uri": request.build_absolute_uri(CALLBACK),
                    "client_id": oidc.accepted_audiences()[0], "code_verifier": flow["verifier"]}
        if settings.BC_OIDC_CLIENT_SECRET:  # a confidential client; a public one has none
            exchange["client_secret"] = settings.BC_OIDC_CLIENT_SECRET
        answer = httpx.post(token_endpoint, timeout=10, data=exchange)
        id_token = answer.json()["id_token"]
        claims = oidc.verified_claims(id_token)
        if not secrets.compare_digest(str(claims.get("nonce", "")), flow["nonce"]):
            raise Unauthenticated("the ID token is not the answer to this sign-in")
        principal = oidc_principal(oidc.identity_of(id_token))
    except (httpx.HTTPError, ValueError, KeyError):
        return _refused(request, "the sign-in service gave no ID token")
    except ComputeError as refused:
        return _refused(request, refused.message)
    request.session.cycle_key()
    request.session[SESSION_OIDC] = {"principal": principal.id,
                                     "expires": float(claims["exp"])}
    return HttpResponseRedirect("/console/")


def _refused(request: HttpRequest, message: str) -> HttpResponse:
    return render(request, "console/sign_in.html",
                  {"error": message, "oidc": oidc.configured()}, status=401)
