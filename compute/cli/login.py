"""`better-compute login`: sign in with the OpenID Connect issuer the API trusts.

By default as a native app does (RFC 8252): the authorization code flow with PKCE, the
browser sent back to a loopback port this command listens on. With `--device`, on a machine
without a browser, the device authorization grant (RFC 8628): it prints a code to type on
any other device, and polls until it is approved. The token (the ID token, or a JWT access
token where the grant gives no ID token) is kept in a 0600 file that
BETTER_COMPUTE_TOKEN_FILE names; it lasts as long as the issuer made it last."""

from __future__ import annotations

import base64
import json
import os
import secrets
import sys
import threading
import time
import webbrowser
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

import click

from compute.cli.client import CliError
from compute.core.pkce import pkce_pair


def default_token_file() -> Path:
    home = Path(os.path.expanduser("~"))
    return home / ".config" / "better-compute" / "token"


@click.command("login")
@click.option("--issuer", required=True, help="The OpenID Connect issuer's URL.")
@click.option("--client-id", required=True, help="This CLI's client id at the issuer.")
@click.option("--client-secret-file", type=click.Path(exists=True, dir_okay=False),
              default=None, help="A file holding the client's secret, for an issuer that "
                                 "wants one of installed apps (a public client has none).")
@click.option("--port", type=click.IntRange(1024, 65535), default=8250, show_default=True,
              help="The loopback port the issuer sends the browser back to "
                   "(http://127.0.0.1:PORT/callback must be a redirect URI of the client).")
@click.option("--out", "out", type=click.Path(dir_okay=False), default=None,
              help="Where to keep the ID token (default: ~/.config/better-compute/token).")
@click.option("--no-browser", is_flag=True, help="Print the URL only; open it yourself.")
@click.option("--timeout", type=click.FloatRange(1, 3600), default=300.0, show_default=True,
              help="Seconds to wait for the sign-in.")
@click.option("--device", is_flag=True,
              help="Sign in from another device: print a code to type there (RFC 8628).")
@click.option("--device-endpoint", default=None, metavar="URL",
              help="The issuer's device authorization endpoint, where its discovery "
                   "document does not name one.")
def login(issuer: str, client_id: str, client_secret_file: str | None, port: int,
          out: str | None, no_browser: bool, timeout: float, device: bool,
          device_endpoint: str | None) -> None:
    """Sign in with single sign-on; the token is kept for the CLI (BETTER_COMPUTE_TOKEN_FILE)."""
    import httpx

    try:
        discovery = httpx.get(f"{issuer.rstrip('/')}/.well-known/openid-configuration",
                              timeout=10).json()
        authorize, token_endpoint = (discovery["authorization_endpoint"],
                                     discovery["token_endpoint"])
    except (httpx.HTTPError, ValueError, KeyError) as error:
        raise CliError(f"the issuer {issuer} does not answer as an OpenID provider: "
                       f"{error}") from None
    secret = Path(client_secret_file).read_text().strip() if client_secret_file else None
    if device:
        endpoint = device_endpoint or discovery.get("device_authorization_endpoint")
        if not endpoint:
            raise CliError(f"the issuer {issuer} names no device authorization endpoint: "
                           "give --device-endpoint")
        keep(_device_grant(endpoint, token_endpoint, client_id, secret, timeout), out)
        return
    redirect = f"http://127.0.0.1:{port}/callback"
    (verifier, challenge), state = pkce_pair(), secrets.token_urlsafe(24)
    url = authorize + "?" + urlencode({
        "response_type": "code", "client_id": client_id, "redirect_uri": redirect,
        "scope": "openid email profile", "state": state, "code_challenge": challenge,
        "code_challenge_method": "S256"})
    answer = _await_redirect(port, url, open_browser=not no_browser, timeout=timeout)
    if answer.get("state") != [state]:
        raise CliError("the sign-in came back with another state: try again")
    if "code" not in answer:
        raise CliError(f"the issuer said no: {answer.get('error', ['?'])[0]}")
    exchange = {"grant_type": "authorization_code", "code": answer["code"][0],
                "redirect_uri": redirect, "client_id": client_id, "code_verifier": verifier}
    if secret:
        exchange["client_secret"] = secret
    try:
        tokens = httpx.post(token_endpoint, timeout=10, data=exchange).json()
    except (httpx.HTTPError, ValueError) as error:
        raise CliError(f"the issuer's token endpoint does not answer: {error}") from None
    id_token = tokens.get("id_token") if isinstance(tokens, dict) else None
    if not id_token:
        said = tokens.get("error_description") or tokens.get("error") if isinstance(
            tokens, dict) else None
        raise CliError(f"the issuer gave no ID token: {said or 'no reason given'}")
    keep(id_token, out)


def keep(token: str, out: str | None) -> None:
    """Write the token to its 0600 file and say how the CLI uses it."""
    path = Path(out) if out else default_token_file()
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(token + "\n")
    os.chmod(path, 0o600)
    claims = _claims(token)
    who = claims.get("email") or claims.get("sub")
    click.echo(f"signed in as {who}; the token is in {path} (0600). Use it with:",
               err=True)
    click.echo(f"export BETTER_COMPUTE_TOKEN_FILE={path}")


GRANT_DEVICE = "urn:ietf:params:oauth:grant-type:device_code"


def _device_grant(endpoint: str, token_endpoint: str, client_id: str, secret: str | None,
                  timeout: float) -> str:
    """RFC 8628: ask for a code, show it, poll until the user approved it elsewhere."""
    import httpx

    client = {"client_id": client_id, **({"client_secret": secret} if secret else {})}
    try:
        asked = httpx.post(endpoint, timeout=10,
                           data={**client, "scope": "openid profile email"}).json()
        device_code, user_code = asked["device_code"], asked["user_code"]
    except (httpx.HTTPError, ValueError, KeyError) as error:
        raise CliError(f"the issuer gave no device code: {error}") from None
    where = asked.get("verification_uri_complete") or asked.get("verification_uri", "")
    click.echo(f"To sign in, open {where} on any device and enter the code {user_code}",
               err=True)
    sys.stderr.flush()
    interval = float(asked.get("interval", 5))
    deadline = time.monotonic() + min(timeout, float(asked.get("expires_in", timeout)))
    while time.monotonic() < deadline:
        time.sleep(interval)
        try:
            answer = httpx.post(token_endpoint, timeout=10, data={
                **client, "grant_type": GRANT_DEVICE, "device_code": device_code}).json()
        except (httpx.HTTPError, ValueError) as failed:
            raise CliError(f"the issuer's token endpoint does not answer: {failed}") from None
        token = answer.get("id_token") or answer.get("access_token")
        if token:
            return str(token)
        said = answer.get("error")
        if said == "slow_down":
            interval += 5
        elif said != "authorization_pending":
            raise CliError(f"the sign-in was not approved: {said or answer}")
    raise CliError(f"no sign-in within {timeout:.0f} s")


def _await_redirect(port: int, url: str, *, open_browser: bool, timeout: float
                    ) -> dict[str, list[str]]:
    """Listen on the loopback port, show (and open) the URL, and return the query the
    browser is sent back with."""
    got: dict[str, Any] = {}
    done = threading.Event()

    class Callback(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            parts = urlsplit(self.path)
            if parts.path != "/callback":
                self.send_response(404)
                self.end_headers()
                return
            got.update(parse_qs(parts.query))
            body = b"Signed in: you can close this window and go back to the terminal.\n"
            self.send_response(200)
            self.send_header("content-type", "text/plain; charset=utf-8")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            done.set()

        def log_message(self, *args: object) -> None:
            pass

    try:
        server = HTTPServer(("127.0.0.1", port), Callback)
    except OSError as error:
        raise CliError(f"cannot listen on 127.0.0.1:{port} for the sign-in: {error}") from None
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        click.echo(f"Open this URL to sign in:\n{url}", err=True)
        sys.stderr.flush()
        if open_browser:
            webbrowser.open(url)
        if not done.wait(timeout):
            raise CliError(f"no sign-in within {timeout:.0f} s")
    finally:
        server.shutdown()
        server.server_close()
    return got


def _claims(token: str) -> dict[str, Any]:
    try:
        payload = token.split(".")[1]
        return dict(json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4))))
    except (IndexError, ValueError):
        return {}
