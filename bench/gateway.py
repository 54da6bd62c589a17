"""Gateway cost per node session: N simulated sessions heartbeating every 10 s.

Starts a real gateway process, opens N mTLS sessions (one per node, each with its own key
and certificate) from a few client processes running the agent's session code, lets them
heartbeat for a while, and prints the gateway's CPU seconds per 1,000 heartbeats, its share
of one core and its memory per session (peak, and steady at the end).

The same sessions then go to two bare gRPC servers of the same service that do nothing per
session (bench.session_floor): one on the same mTLS credentials, one without TLS. What the
gateway costs above the first is its own; the first above the second is TLS's; the second is
gRPC's HTTP/2 connection and stream.

    python -m bench.gateway [--sessions 1000] [--seconds 40] [--clients 4] [--no-floor]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench.common import bench_environment, process_cpu_seconds, table


def memory_kib(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key):
            return int(line.split()[1])
    return 0


def make_nodes(count: int) -> list[tuple[Any, bytes, bytes]]:
    """Nodes with keys and certificates, created straight in the database."""
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509 import CertificateSigningRequestBuilder, Name, NameAttribute
    from cryptography.x509.oid import NameOID
    from django.utils import timezone

    from bcd.contract.crypto import public_pem, spki_pin
    from compute.platform.tenancy.selectors import root_tenant
    from compute.platform.tenancy.services import root_bootstrap
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


def node_files(nodes: list[tuple[Any, bytes, bytes]], shares: int, folder: Path) -> list[Path]:
    """The nodes as JSON files for the client processes, one share each."""
    from cryptography.hazmat.primitives import serialization

    files = []
    for share in range(shares):
        rows = [[key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                   serialization.NoEncryption()).decode(), cert.decode(),
                 ca.decode()] for key, cert, ca in nodes[share::shares]]
        path = folder / f"nodes-{share}.json"
        path.write_text(json.dumps(rows))
        files.append(path)
    return files


def measure(server_argv: list[str], env: dict[str, str], target: str, files: list[Path],
            seconds: float, label: str, plain: bool = False, rate: float = 100
            ) -> dict[str, float]:
    """Start a server, connect every node from the client processes, then read the
    server's CPU over `seconds` and its memory."""
    server = subprocess.Popen(server_argv, env=env)
    try:
        time.sleep(3)
        baseline = memory_kib(server.pid, "VmRSS")
        clients = [subprocess.Popen(
            [sys.executable, "-m", "bench.session_clients", "--nodes", str(path), "--target",
             target, "--ramp", str(len(files) / rate), *(["--plain"] if plain else [])],
            stdout=subprocess.PIPE, text=True)
            for path in files]
        try:
            progress = Progress(clients)
            total = sum(len(json.loads(path.read_text())) for path in files)
            progress.wait_all(total, label)
            time.sleep(2)
            at_start = progress.connected()
            cpu_before, started = process_cpu_seconds(server.pid), time.monotonic()
            time.sleep(seconds)
            cpu = process_cpu_seconds(server.pid) - cpu_before
            elapsed = time.monotonic() - started
            # Counted over the window: the fewer of its start and its end (none lost means
            # both are the same).
            connected = min(at_start, progress.connected())
            return {"connected": connected, "cpu": cpu, "heartbeats": connected * elapsed / 10,
                    "elapsed": elapsed, "baselineKiB": baseline,
                    "peakKiB": memory_kib(server.pid, "VmHWM"),
                    "rssKiB": memory_kib(server.pid, "VmRSS")}
        finally:
            for client in clients:
                client.terminate()
            for client in clients:
                client.wait(30)
    finally:
        server.terminate()
        server.wait(30)


class Progress:
    """The clients' `connected N` lines, read on threads: how many sessions are up."""

    def __init__(self, clients: list[subprocess.Popen[str]]) -> None:
        self.counts = [0] * len(clients)
        self.lines: queue.Queue[tuple[int, str]] = queue.Queue()
        for index, client in enumerate(clients):
            threading.Thread(target=self._read, args=(index, client), daemon=True).start()

    def _read(self, index: int, client: subprocess.Popen[str]) -> None:
        assert client.stdout is not None
        for line in client.stdout:
            self.lines.put((index, line))

    def connected(self, wait: float = 0.0) -> int:
        """Sessions up now, after taking in every line told so far (waiting up to `wait`
        seconds for the next one)."""
        with contextlib.suppress(queue.Empty):
            while True:
                index, line = self.lines.get(timeout=wait) if wait else self.lines.get_nowait()
                wait = 0.0
                if line.startswith("connected "):
                    self.counts[index] = int(line.split()[1])
        return sum(self.counts)

    def wait_all(self, total: int, label: str) -> int:
        """Until every session is up, or two minutes pass without progress; shows progress."""
        last_progress, shown, before = time.monotonic(), 0.0, -1
        while (now := self.connected(wait=1.0)) < total:
            if now != before:
                last_progress, before = time.monotonic(), now
            if time.monotonic() - last_progress > 120:
                break
            if time.monotonic() - shown > 5:
                print(f"  {label}: {now} / {total} sessions connected", flush=True)
                shown = time.monotonic()
        return now


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sessions", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=40)
    parser.add_argument("--clients", type=int, default=4, help="client processes")
    parser.add_argument("--connect-rate", type=float, default=100,
                        help="new sessions per second, from all clients together")
    parser.add_argument("--no-floor", action="store_true",
                        help="measure only the gateway, not the bare gRPC servers")
    args = parser.parse_args()
    # The nodes' keys and the gateway's credentials live in a 0700 folder, gone at the end.
    with bench_environment() as (url, _children), \
            tempfile.TemporaryDirectory(prefix="bc-gw-") as temporary:
        print(f"creating {args.sessions} nodes with certificates …", flush=True)
        nodes = make_nodes(args.sessions)
        from django.core.management import call_command

        folder = Path(temporary)
        call_command("bc_gateway_credentials", out=folder / "certs", host=["127.0.0.1"],
                     stdout=open(os.devnull, "w"))  # noqa: SIM115
        files = node_files(nodes, args.clients, folder)
        env = {**os.environ, "DATABASE_URL": url, "BETTER_COMPUTE_LOG_LEVEL": "WARNING"}
        port, certs = 18443, str(folder / "certs")
        runs = {"gateway": [sys.executable, "-m", "gateway", "--listen", f"127.0.0.1:{port}",
                            "--join-listen", f"127.0.0.1:{port + 1}", "--cert-dir", certs]}
        if not args.no_floor:
            floor = [sys.executable, "-m", "bench.session_floor", "--listen",
                     f"127.0.0.1:{port}", "--cert-dir", certs]
            runs["gRPC + mTLS, nothing per session"] = floor
            runs["gRPC without TLS, nothing per session"] = [*floor, "--plain"]
        results = {}
        for label, argv in runs.items():
            print(f"{label}: opening {args.sessions} sessions from {args.clients} processes, "
                  f"then measuring for {args.seconds:.0f} s …", flush=True)
            results[label] = measure(argv, env, f"127.0.0.1:{port}", files, args.seconds,
                                     label, plain="without TLS" in label,
                                     rate=args.connect_rate)
        print()
        print(table([row(label, result, args.sessions) for label, result in results.items()]))
        gateway = results["gateway"]
        print()
        print(f"gateway: {gateway['connected']:.0f} of {args.sessions} sessions; "
              f"{gateway['cpu'] / gateway['elapsed'] * 100:.1f}% of one core at 10 s "
              "heartbeats")


def row(label: str, result: dict[str, float], sessions: int) -> dict[str, str]:
    connected, before = max(1, result["connected"]), result["baselineKiB"]
    per_1000 = result["cpu"] / (result["heartbeats"] / 1000) if result["heartbeats"] else 0
    return {"server": label, "connected": f"{result['connected']:.0f}/{sessions}",
            "cpu_s_per_1000_beats": f"{per_1000:.3f}",
            "core_share_%": f"{result['cpu'] / result['elapsed'] * 100:.1f}",
            "peak_KiB_per_session": f"{(result['peakKiB'] - before) / connected:.1f}",
            "steady_KiB_per_session": f"{(result['rssKiB'] - before) / connected:.1f}",
            "before_MiB": f"{before / 1024:.0f}"}


if __name__ == "__main__":
    main()
