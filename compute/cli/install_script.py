"""`better-compute daemon install-script`: a POSIX shell installer for one pool.

The script pins the bcd artifact's SHA-256 per architecture and the PKI's three pins; it
checks the host, downloads and verifies bcd, writes /etc/bcd/config.toml with the server and
pins, runs `bcd doctor`, pipes the token from standard input into `bcd join` (which checks
the token's site, and uses the pinned gateway only if the control plane publishes none) and
enables bcd.service. bcd is one executable: the node needs no Python. BCD_ROOT (default /)
installs under another root, for tests.
"""

from __future__ import annotations

import shlex
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click

from compute.cli.artifact import write_artifacts
from compute.cli.common import client as make_client

ARCHES = {"amd64": "x86_64", "arm64": "aarch64"}

TEMPLATE = r"""#!/bin/sh
# bcd installer for pool {pool} (site {site}), made {made}.
# Usage, as root:  sh install-bcd.sh < join-token
set -eu

BASE_URL={base_url}
SERVER="$BASE_URL/api/compute"
GATEWAY_URL={gateway_url}
SITE={site_q}
BCD_VERSION={version}
SERVING_CA_PIN={serving_ca_pin}
JOIN_SIGNING_PIN={join_signing_pin}
JOIN_ENCRYPTION_PIN={join_encryption_pin}
ROOT="${{BCD_ROOT:-/}}"
ROOT="${{ROOT%/}}"

say() {{ printf 'install-bcd: %s\n' "$*" >&2; }}
fail() {{ say "$*"; exit 1; }}

# 1. The host.
[ "$(uname -s)" = Linux ] || fail "bcd runs on Linux only"
if [ -z "${{BCD_ROOT:-}}" ] && [ "$(id -u)" -ne 0 ]; then fail "run as root"; fi
case "$(uname -m)" in
{arch_cases}
  *) fail "no bcd build for $(uname -m)" ;;
esac
command -v sha256sum >/dev/null 2>&1 || fail "sha256sum is required"
[ -t 0 ] && fail "pipe the join token on standard input: sh install-bcd.sh < join-token"

# 2. Download bcd (one executable: no Python needed) and verify it against the pinned digest.
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
ARTIFACT="bcd_${{BCD_VERSION}}_linux_${{ARCH}}"
say "downloading $ARTIFACT"
if command -v curl >/dev/null 2>&1; then
  curl -fsSL -o "$WORK/$ARTIFACT" "$BASE_URL/downloads/$ARTIFACT"
else
  wget -q -O "$WORK/$ARTIFACT" "$BASE_URL/downloads/$ARTIFACT"
fi
printf '%s  %s\n' "$SHA256" "$WORK/$ARTIFACT" | sha256sum -c - >/dev/null \
  || fail "$ARTIFACT does not match its pinned SHA-256"
mkdir -p "$ROOT/usr/local/bin"
install -m 0755 "$WORK/$ARTIFACT" "$ROOT/usr/local/bin/bcd" || fail "installing bcd failed"
BCD="$ROOT/usr/local/bin/bcd"
"$BCD" --version >/dev/null || fail "$ARTIFACT does not run on this machine"

# 3. config.toml with the server and the pins (bcd join completes it).
mkdir -p "$ROOT/etc/bcd"
chmod 0700 "$ROOT/etc/bcd"
if [ ! -s "$ROOT/etc/bcd/config.toml" ]; then
  umask 077
  cat > "$ROOT/etc/bcd/config.toml" <<CONFIG
server = "$SERVER"
gateway = "$GATEWAY_URL"
serving_ca_pin = "$SERVING_CA_PIN"
join_signing_pin = "$JOIN_SIGNING_PIN"
join_encryption_pin = "$JOIN_ENCRYPTION_PIN"
CONFIG
fi

# 4. Doctor, then join with the token from standard input.
SIM=""
[ -n "${{BCD_SIM:-}}" ] && SIM="--sim"
"$BCD" --root "$ROOT/" doctor --server "$SERVER" $SIM || say "doctor found problems (see above)"
"$BCD" --root "$ROOT/" join --server "$SERVER" --serving-ca-pin "$SERVING_CA_PIN" \
  --join-signing-pin "$JOIN_SIGNING_PIN" --join-encryption-pin "$JOIN_ENCRYPTION_PIN" $SIM \
  --gateway-url "$GATEWAY_URL" --expect-site "$SITE" \
  || fail "bcd join failed"

# 5. The systemd unit.
mkdir -p "$ROOT/etc/systemd/system"
cat > "$ROOT/etc/systemd/system/bcd.service" <<UNIT
[Unit]
Description=better-compute node agent
After=network-online.target
Wants=network-online.target

[Service]
Type=notify
NotifyAccess=main
WatchdogSec=30
ExecStart=$BCD --root $ROOT/ node
Restart=always
RestartSec=2

[Install]
WantedBy=multi-user.target
UNIT
if [ "$ROOT" = "" ] && command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
  systemctl daemon-reload
  systemctl enable --now bcd.service
  say "bcd.service enabled and started"
else
  say "no systemd here: run '$BCD --root $ROOT/ node' yourself"
fi
"""


def render(*, pool: str, site: str, gateway_url: str, base_url: str, version: str,
           digests: dict[str, str], pins: dict[str, str]) -> str:
    cases = "\n".join(f"  {machine}) ARCH={arch}; SHA256={shlex.quote(digests[arch])} ;;"
                      for arch, machine in ARCHES.items() if arch in digests)
    return TEMPLATE.format(
        pool=pool, site=site, site_q=shlex.quote(site),
        made=datetime.now(UTC).isoformat(timespec="seconds"),
        base_url=shlex.quote(base_url.rstrip("/")), gateway_url=shlex.quote(gateway_url),
        version=shlex.quote(version), arch_cases=cases,
        serving_ca_pin=shlex.quote(pins["servingCaSpkiPin"]),
        join_signing_pin=shlex.quote(pins["joinSigningKeyPin"]),
        join_encryption_pin=shlex.quote(pins["joinEncryptionKeyPin"]))


def parse_digests(values: tuple[str, ...]) -> dict[str, str]:
    digests = {}
    for text in values:
        arch, sep, digest = text.partition("=")
        if not sep or arch not in ARCHES or len(digest) != 64 or not all(
                c in "0123456789abcdef" for c in digest.lower()):
            raise click.BadParameter(f"{text!r} is not ARCH=SHA256 (ARCH: amd64 or arm64)")
        digests[arch] = digest.lower()
    return digests


@click.group()
def daemon() -> None:
    """Installing bcd on servers."""


@daemon.command("install-script")
@click.option("--pool", required=True)
@click.option("--site", required=True)
@click.option("--gateway-url", required=True)
@click.option("--base-url", required=True, help="Where the API and /downloads are served.")
@click.option("--bcd-version", required=True)
@click.option("--sha256", "sha256", multiple=True, required=True, help="ARCH=SHA256")
@click.option("--out", type=click.Path(dir_okay=False), required=True)
@click.option("--tenant", default=None)
def install_script(pool: str, site: str, gateway_url: str, base_url: str, bcd_version: str,
                   sha256: tuple[str, ...], out: str, tenant: str | None) -> None:
    """Write a shell installer that pins bcd's digest and the PKI's pins."""
    api = make_client()
    api.call("pools.get", {"poolId": pool}, tenant=tenant)  # fails clearly on a wrong pool
    pins: dict[str, Any] = api.call("pki.show", tenant=tenant)
    text = render(pool=pool, site=site, gateway_url=gateway_url, base_url=base_url,
                  version=bcd_version, digests=parse_digests(sha256), pins=pins)
    with open(out, "w") as handle:
        handle.write(text)
    click.echo(f"installer written to {out}: copy it and a join token to the server, then "
               f"run: sudo sh {out} < join-token", err=True)


@daemon.command("artifact")
@click.option("--out", "out", type=click.Path(file_okay=False, path_type=Path), required=True,
              help="The downloads folder (BETTER_COMPUTE_DOWNLOADS_DIR of the API).")
@click.option("--executable/--wheel-only", default=True, show_default=True,
              help="Also build this machine's single-file executable (PyInstaller, from the "
                   "`artifacts` extra; about a minute; build on each architecture you serve).")
def artifact(out: Path, executable: bool) -> None:
    """Write the agent's wheel (better_compute_agent-<version>-py3-none-any.whl, Python 3.10
    or newer) and its executable bcd_<version>_linux_<arch>; prints each with the SHA-256
    to pin with install-script --sha256 ARCH=SHA256."""
    for name, (path, digest) in write_artifacts(out, executable=executable).items():
        click.echo(f"{name}  {digest}  {path}")
