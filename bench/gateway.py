"""Gateway cost per node session: N simulated sessions heartbeating every 10 s.

Starts a real gateway process, opens N mTLS sessions (one per node, each with its own key
and certificate), lets them heartbeat for a while, and prints the gateway's CPU seconds per
1,000 heartbeats and its peak memory per session.

    python -m bench.gateway [--sessions 1000] [--seconds 40]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import bench_environment

TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def memory_kib(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key):
            return int(line.split()[1])
    return 0


def make_nodes(count: int) -> list[tuple[object, bytes, bytes]]:
    """Nodes with keys and certificates, created straight in the database."""
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509 import CertificateSigningRequestBuilder, Name, NameAttribute
    from cryptography.x509.oid import NameOID
    from django.utils import timezone

    from bcd.contract.crypto import public_pem, spki_pin
    from compute.tenancy.selectors import root_tenant
    from compute.tenancy.services import root_bootstrap
    from fleet.models import Node
    from fleet.pki import issue_node_certificate, pki
    from fleet.services.pools import pool_create
    from fleet.services.sites import site_create

    admin = root_bootstrap().token.principal
    site = site_create(tenant=root_tenant(), actor=admin, kind="shared", region="bench")
    pool = pool_create(tenant=root_tenant(), actor=admin, site_id=site.id,
                       pool_class="metal-host", gpu_model="H100")
    nodes = []
    for n in range(count):
        key = ec.generate_private_key(ec.SECP256R1())
        node = Node.objects.create(pool=pool, site=site, hostname=f"bench-{n}",
                                   key_pin=spki_pin(key.public_key()),
                                   public_key=public_pem(key.public_key()))
        csr = (CertificateSigningRequestBuilder()
               .subject_name(Name([NameAttribute(NameOID.COMMON_NAME, node.id)]))
               .sign(key, hashes.SHA256()))
        cert = issue_node_certificate(csr, site_id=site.id, node_id=node.id,
                                      now=timezone.now())
        nodes.append((key, cert.public_bytes(serialization.Encoding.PEM),
                      pki().ca_pem.encode()))
    return nodes


async def run_sessions(target: str, nodes: list, seconds: float, pid: int) -> dict[str, float]:
    from bcd.inventory.fake import SimulatedInventory
    from bcd.session import AgentSession, Credentials

    async def no_commands(command_id: str, kind: str, payload: dict) -> tuple[str, dict]:
        return "failed", {}

    sessions = [AgentSession(credentials=Credentials(key, cert, ca), target=target,
                             inventory=SimulatedInventory(f"bench-{i}"), run_command=no_commands)
                for i, (key, cert, ca) in enumerate(nodes)]
    baseline = memory_kib(pid, "VmRSS")
    tasks = []
    for session in sessions:
        tasks.append(asyncio.create_task(session.run()))
        await asyncio.sleep(0.005)  # a gentle ramp, like a fleet coming back
    deadline = time.monotonic() + 120
    while sum(s.state.connected for s in sessions) < len(sessions):
        if time.monotonic() > deadline:
            break
        await asyncio.sleep(0.5)
    connected = sum(s.state.connected for s in sessions)
    await asyncio.sleep(2)
    cpu_before, started = cpu_seconds(pid), time.monotonic()
    await asyncio.sleep(seconds)
    cpu = cpu_seconds(pid) - cpu_before
    elapsed = time.monotonic() - started
    beats = connected * elapsed / 10
    peak = memory_kib(pid, "VmHWM")
    for task in tasks:
        task.cancel()
    return {"connected": connected, "cpu": cpu, "heartbeats": beats, "elapsed": elapsed,
            "baselineKiB": baseline, "peakKiB": peak}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sessions", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=40)
    args = parser.parse_args()
    with bench_environment() as (url, children):
        print(f"creating {args.sessions} nodes with certificates …", flush=True)
        nodes = make_nodes(args.sessions)
        from django.core.management import call_command

        cert_dir = tempfile.mkdtemp(prefix="bc-gw-")
        call_command("bc_gateway_credentials", out=Path(cert_dir), host=["127.0.0.1"],
                     stdout=open(os.devnull, "w"))  # noqa: SIM115
        port = 18443
        gateway = subprocess.Popen(
            [sys.executable, "-m", "gateway", "--listen", f"127.0.0.1:{port}",
             "--join-listen", f"127.0.0.1:{port + 1}", "--cert-dir", cert_dir],
            env={**os.environ, "DATABASE_URL": url, "BETTER_COMPUTE_LOG_LEVEL": "WARNING"})
        children.append(gateway)
        time.sleep(3)
        print(f"opening {args.sessions} sessions, then measuring for {args.seconds:.0f} s …",
              flush=True)
        result = asyncio.run(run_sessions(f"127.0.0.1:{port}", nodes, args.seconds,
                                          gateway.pid))
        per_1000 = result["cpu"] / (result["heartbeats"] / 1000) if result["heartbeats"] else 0
        per_session = (result["peakKiB"] - result["baselineKiB"]) / max(1, result["connected"])
        print()
        print(f"sessions connected:                {result['connected']:.0f} / {args.sessions}")
        print(f"heartbeats in {result['elapsed']:.0f} s:              {result['heartbeats']:.0f}")
        print(f"gateway CPU per 1,000 heartbeats:  {per_1000:.3f} s "
              f"({result['cpu']:.2f} s in the window, sessions idle otherwise)")
        print(f"gateway peak memory per session:   {per_session:.1f} KiB "
              f"(peak {result['peakKiB'] / 1024:.0f} MiB, before sessions "
              f"{result['baselineKiB'] / 1024:.0f} MiB)")


if __name__ == "__main__":
    main()
