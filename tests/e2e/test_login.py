"""Single sign-on from the CLI, against real OpenID provider processes and a dev stack that
trusts them: `better-compute login` (the code flow with PKCE back to a loopback port, or
`--device`: the device authorization grant, approved from "another device") keeps the token
in a 0600 file, and the CLI calls the API with it as the role its groups map to."""

from __future__ import annotations

import stat
import subprocess
import sys

import httpx

from tests.e2e.conftest import start_stack, stop_stack
from tests.support.oidc import running_provider
from tests.support.processes import free_port


def trusting(tmp_path, issuer: str, client_id: str):
    """A dev stack whose API trusts `issuer` for `client_id`, `gpu-ops` being root's
    operators."""
    return start_stack(tmp_path, "--sim", "1", env_extra={
        "BETTER_COMPUTE_OIDC_ISSUER": issuer,
        "BETTER_COMPUTE_OIDC_AUDIENCE": f"console,{client_id}",
        "BETTER_COMPUTE_OIDC_ROLES": "gpu-ops=root:operator"})


def signed_in_as_an_operator(stack, login: subprocess.Popen[str], token_file) -> dict:
    """The finished `login` kept its token (0600); the CLI's environment that uses it, after
    checking it acts as root's operator."""
    out, err = login.communicate(timeout=30)
    assert login.returncode == 0, err
    assert out.strip() == f"export BETTER_COMPUTE_TOKEN_FILE={token_file}"
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
    sso = {k: v for k, v in stack.env.items() if k != "BETTER_COMPUTE_TOKEN"}
    sso["BETTER_COMPUTE_TOKEN_FILE"] = str(token_file)
    assert stack.json("system", "whoami", env=sso)["tenantId"] == stack.json(
        "tenants", "get")["id"]  # root's
    refused = stack.cli("tenants", "create", "--slug", "intruder", env=sso)
    assert refused.returncode != 0  # an operator creates no tenants
    assert "not allowed" in refused.stderr
    return sso


def test_login_keeps_a_token_the_cli_calls_with_as_its_groups_role(tmp_path):
    with running_provider() as provider:
        port = free_port()
        client = httpx.post(f"{provider.issuer}/oauth2/clients", timeout=10, json={
            "redirect_uris": [f"http://127.0.0.1:{port}/callback"],
            "token_endpoint_auth_method": "client_secret_post"}).json()
        secret_file = tmp_path / "client-secret"
        secret_file.write_text(client["client_secret"])
        provider.set_user("erin", email="erin@example.com", groups=["gpu-ops"])
        stack = trusting(tmp_path, provider.issuer, client["client_id"])
        try:
            token_file = tmp_path / "sso" / "token"
            login = subprocess.Popen(
                [sys.executable, "-m", "compute.cli.main", "login", "--issuer",
                 provider.issuer, "--client-id", client["client_id"], "--client-secret-file",
                 str(secret_file), "--port", str(port),
                 "--no-browser", "--out", str(token_file), "--timeout", "60"],
                env=stack.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            assert login.stderr is not None
            assert login.stderr.readline().startswith("Open this URL to sign in")
            url = login.stderr.readline().strip()
            consent = httpx.post(url, data={"sub": "erin"}, timeout=10)  # the browser
            back = httpx.get(consent.headers["location"], timeout=10)  # … sent back
            assert back.status_code == 200
            sso = signed_in_as_an_operator(stack, login, token_file)
            nodes = stack.json("nodes", "list", env=sso)  # an operator reads the fleet
            assert [n["id"] for n in nodes["items"]] == [
                n["id"] for n in stack.json("nodes", "list")["items"]]
        finally:
            assert stop_stack(stack) == 0


def test_login_with_the_device_grant_from_a_machine_without_a_browser(tmp_path):
    from tests.support.oidc import running_device_provider

    with running_device_provider(tmp_path, group="gpu-ops") as provider:
        stack = trusting(tmp_path, provider.issuer, provider.client_id)
        try:
            token_file = tmp_path / "sso" / "token"
            login = subprocess.Popen(
                [sys.executable, "-m", "compute.cli.main", "login", "--device", "--issuer",
                 provider.issuer, "--client-id", provider.client_id, "--device-endpoint",
                 f"{provider.issuer}/device-authorization/", "--out", str(token_file),
                 "--timeout", "60"],
                env=stack.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            assert login.stderr is not None
            said = login.stderr.readline()
            assert said.startswith(f"To sign in, open {provider.url}/o/device/"), said
            provider.approve(said.split()[-1])  # typed on a phone, say
            signed_in_as_an_operator(stack, login, token_file)  # the JWT access token
        finally:
            assert stop_stack(stack) == 0
