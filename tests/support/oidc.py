"""A real OpenID Connect provider (the `oidc-provider-mock` package's server, run as its own
process) and a browser-less sign-in against it: the authorization code flow with PKCE, as a
relying party runs it, the user's consent given by posting the provider's own form."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import httpx

from compute.core.pkce import pkce_pair
from tests.support.processes import free_port

REDIRECT = "http://127.0.0.1:1/callback"  # never fetched: the code is read off the redirect


@dataclass(frozen=True)
class Provider:
    issuer: str

    def set_user(self, sub: str, **claims: object) -> None:
        httpx.put(f"{self.issuer}/users/{sub}", json=claims, timeout=10).raise_for_status()

    def tokens(self, sub: str, *, client_id: str) -> dict[str, str]:
        """Sign `sub` in for `client_id`: the code flow with PKCE; the token response."""
        verifier, challenge = pkce_pair()
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


def until_serving(issuer: str, process: subprocess.Popen[bytes], *, within: float) -> None:
    """Until the provider answers its discovery document; its last words if it died."""
    deadline = time.monotonic() + within
    while True:
        try:
            if httpx.get(f"{issuer}/.well-known/openid-configuration",
                         timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline or process.poll() is not None:
            said = process.stderr.read().decode()[-2000:] if (
                process.poll() is not None and process.stderr) else ""
            raise AssertionError(f"the OpenID provider at {issuer} did not start: {said}")
        time.sleep(0.1)


@contextmanager
def running_provider(*, token_max_age: int = 60) -> Iterator[Provider]:
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "oidc_provider_mock", "--port", str(port),
         "--token-max-age", str(token_max_age)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    issuer = f"http://127.0.0.1:{port}"
    try:
        until_serving(issuer, process, within=30)
        yield Provider(issuer)
    finally:
        process.terminate()
        process.wait(timeout=10)


@dataclass(frozen=True)
class DeviceProvider:
    """The device-grant provider (tests/support/device_provider), its CLI client and user."""

    url: str
    client_id: str
    username: str
    password: str

    @property
    def issuer(self) -> str:
        return f"{self.url}/o"

    def approve(self, user_code: str) -> None:
        """What the user does in a browser: sign in, type the code, accept."""
        with httpx.Client(base_url=self.url, timeout=10, follow_redirects=True) as browser:
            page = browser.get("/o/device/")  # → the sign-in form first
            browser.post(str(page.url), data={
                "username": self.username, "password": self.password,
                "csrfmiddlewaretoken": browser.cookies["csrftoken"]})
            browser.get("/o/device/")
            confirm = browser.post("/o/device/", data={
                "user_code": user_code, "csrfmiddlewaretoken": browser.cookies["csrftoken"]})
            accepted = browser.post(str(confirm.url), data={
                "action": "accept", "csrfmiddlewaretoken": browser.cookies["csrftoken"]})
            assert accepted.status_code == 200, accepted.text[:300]


@contextmanager
def running_device_provider(folder: Path, *, group: str) -> Iterator[DeviceProvider]:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    key_file = folder / "provider-key.pem"
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    provider = DeviceProvider(url, "better-compute-cli", "frank", "a-long-passphrase-1")
    env = {**os.environ, "DEVICE_PROVIDER_DB": str(folder / "provider.sqlite3"),
           "DEVICE_PROVIDER_KEY": str(key_file), "DEVICE_PROVIDER_URL": url,
           "DJANGO_SETTINGS_MODULE": "tests.support.device_provider.settings"}
    env.pop("DATABASE_URL", None)
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.support.device_provider.serve", str(port),
         provider.client_id, provider.username, provider.password, group],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        until_serving(provider.issuer, process, within=60)
        yield provider
    finally:
        process.terminate()
        process.wait(timeout=10)
