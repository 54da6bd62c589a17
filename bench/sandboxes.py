"""Time from `sandboxes.create` to `running`, split where it is spent, on a real dev stack.

    python -m bench.sandboxes [--rounds 5]

Starts `better-compute dev --memory --sim 2 --sim-variant cpu`, then creates sandboxes (2
vCPUs, 1 GiB, the default busybox image) one at a time and 8 at once. Each one's time is
split by its own events: the API call (claim and spec written), the delivery (spec pushed
to the node, image checked, disk made, QEMU started: `sandbox.created` -> `sandbox.starting`)
and the boot (QEMU start -> the guest's ready line: `sandbox.starting` -> `sandbox.running`).
The baseline, from the same run: the same guest booted by QEMU directly, no control plane.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from bench.common import table


def direct_boot_seconds(kernel: Path, initrd: Path, accel: str) -> float:
    """QEMU started by hand on the same image until the guest's ready line."""
    from bcd import qemu
    from compute.cli.guestimage import BOOT_LINE

    with tempfile.TemporaryDirectory() as folder:
        console = Path(folder) / "console.log"
        started = time.monotonic()
        process = subprocess.Popen(
            [qemu.QEMU, "-accel", accel, *qemu.MACHINE[accel], "-smp", "2", "-m", "1024",
             "-kernel", str(kernel), "-initrd", str(initrd), "-append",
             "console=ttyS0 quiet panic=-1", "-nodefaults", "-display", "none", "-no-reboot",
             "-chardev", f"file,id=c,path={console}", "-serial", "chardev:c"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            while BOOT_LINE not in (console.read_text(errors="replace")
                                    if console.exists() else ""):
                if time.monotonic() - started > 180:
                    raise RuntimeError("the guest did not boot within 180 s")
                time.sleep(0.05)
            return time.monotonic() - started
        finally:
            process.kill()
            process.wait()


def _at(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def one(client: Any, pool: str, out: list[dict[str, float]]) -> None:
    started = time.monotonic()
    box = client.sandboxes.create(pool_id=pool, vcpus=2, memory_gi_b=1)
    api = time.monotonic() - started
    while client.sandboxes.get(sandbox_id=box["id"])["state"] not in ("running", "failed"):
        time.sleep(0.1)
    events = {e["type"]: _at(e["createdAt"])
              for e in client.events.list(subject=box["id"], limit=100)["items"]}
    if "sandbox.running" not in events:
        raise RuntimeError(f"{box['id']} failed: {client.sandboxes.get(sandbox_id=box['id'])}")
    out.append({"api": api,
                "delivery": events["sandbox.starting"] - events["sandbox.created"],
                "boot": events["sandbox.running"] - events["sandbox.starting"],
                "total": time.monotonic() - started, "id": box["id"]})


def release_all(client: Any, boxes: list[dict[str, float]]) -> None:
    for box in boxes:
        client.sandboxes.release(sandbox_id=box["id"])
    for box in boxes:
        while client.sandboxes.get(sandbox_id=box["id"])["state"] not in ("stopped", "failed"):
            time.sleep(0.2)


def row(name: str, runs: list[dict[str, float]], baseline: float) -> dict[str, Any]:
    def p50(key: str) -> float:
        return statistics.median(r[key] for r in runs)

    return {"case": name, "n": len(runs), "api ms p50": f"{p50('api') * 1000:.0f}",
            "delivery s p50": f"{p50('delivery'):.2f}", "boot s p50": f"{p50('boot'):.2f}",
            "total s p50": f"{p50('total'):.2f}",
            "total s max": f"{max(r['total'] for r in runs):.2f}",
            "total / direct boot": f"{p50('total') / baseline:.2f}"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=5, help="Sandboxes one at a time.")
    args = parser.parse_args()
    from bcd.qemu import probe_accelerator
    from compute.client import Client
    from tests.e2e.conftest import start_stack, stop_stack

    with tempfile.TemporaryDirectory() as tmp:
        stack = start_stack(Path(tmp), "--sim", "2", "--sim-variant", "cpu")
        try:
            client = Client(stack.env["BETTER_COMPUTE_URL"], stack.env["BETTER_COMPUTE_TOKEN"])
            pool = stack.env["CPU_POOL"]
            guest = stack.state_dir / "downloads"
            accel = probe_accelerator()
            direct = [direct_boot_seconds(guest / "guest-vmlinuz", guest / "guest-initrd.gz",
                                          accel) for _ in range(3)]
            baseline = statistics.median(direct)
            one(client, pool, [])  # warm: the nodes fetch and cache the image parts
            serial: list[dict[str, float]] = []
            for _ in range(args.rounds):
                one(client, pool, serial)
                release_all(client, serial[-1:])
            burst: list[dict[str, float]] = []
            threads = [threading.Thread(target=one, args=(client, pool, burst))
                       for _ in range(8)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            release_all(client, burst)
        finally:
            stop_stack(stack)
    print(f"accelerator {accel}; direct QEMU boot of the same guest: "
          f"{', '.join(f'{s:.2f}' for s in direct)} s (median {baseline:.2f} s)")
    print(table([row("1 at a time", serial, baseline), row("8 at once", burst, baseline)]))


if __name__ == "__main__":
    main()
