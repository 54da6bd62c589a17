"""A real OpenID Connect provider (the `oidc-provider-mock` package's server, run as its own
process) and a browser-less sign-in against it: the authorization code flow with PKCE, as a
relying party runs it, the user's consent given by posting the provider's own form."""

from __future__ import annotations

import base64
import hashlib
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from urllib.parse import parse_qs, urlsplit

import httpx

from tests.support.processes import free_port

REDIRECT = "http://127.0.0.1:1/callback"  # never fetched: the code is read off the redirect


@dataclass(frozen=True)
class Provider:
    issuer: str

    def set_user(self, sub: str, **claims: object) -> None:
        httpx.put(f"{self.issuer}/users/{sub}", json=claims, timeout=10).raise_for_status()

    def tokens(self, sub: str, *, client_id: str) -> dict[str, str]:
        """Sign `sub` in for `client_id`: the code flow with PKCE; the token response."""
        verifier = secrets.token_urlsafe(48)
        challenge = base64.urlsafe_b64encode(
            hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()
        query = {"client_id": client_id, "redirect_uri": REDIRECT, "response_type": "code",
                 "scope": "openid email", "state": "s", "code_challenge": challenge,
                 "code_challenge_method": "S256"}
        with httpx.Client(base_url=self.issuer, timeout=10) as client:
            consent = client.post("/oauth2/authorize", params=query, data={"sub": sub})
            assert consent.status_code in (302, 303), consent.text
            code = parse_qs(urlsplit(consent.headers["location"]).query)["code"][0]
            answer = client.post("/oauth2/token", data={
                "grant_type": "authorization_code", "code": code, "redirect_uri": REDIRECT,
                "client_id": client_id, "client_secret": "any", "code_verifier": verifier})
            answer.raise_for_status()
            return answer.json()


@contextmanager
def running_provider(*, token_max_age: int = 60) -> Iterator[Provider]:
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "oidc_provider_mock", "--port", str(port),
         "--token-max-age", str(token_max_age)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    issuer = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"{issuer}/.well-known/openid-configuration",
                             timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or process.poll() is not None:
                raise AssertionError("the OpenID provider did not start")
            time.sleep(0.1)
        yield Provider(issuer)
    finally:
        process.terminate()
        process.wait(timeout=10)
