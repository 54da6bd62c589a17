"""Time from `sandboxes.create` until a command runs in it, cold and from a snapshot, on a
real dev stack.

    python -m bench.sandboxes [--rounds 5]

Starts `better-compute dev --memory --sim 1 --sim-variant cpu`, then creates sandboxes (1
vCPU, 1 GiB) of the image `default` (a cold boot) and of the image `snapshot` (the same
guest, restored from a snapshot of it booted), one at a time and 8 at once. Each is timed
from the create call until `sandboxes.exec` of `true` answers (exec-ready), and split by
its own events: the API call (claim and spec written), the delivery (spec pushed to the
node, image checked, disk made, QEMU started: `sandbox.created` -> `sandbox.starting`) and
the boot (QEMU start -> booted: `sandbox.starting` -> `sandbox.running`). One sandbox of
the snapshot image is made first, which makes the node's snapshot (a cold boot and a save).
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


def one(client: Any, pool: str, image: str, out: list[dict[str, float]]) -> None:
    started = time.monotonic()
    box = client.sandboxes.create(pool_id=pool, vcpus=1, memory_gi_b=1, image=image)
    api = time.monotonic() - started
    while client.sandboxes.get(sandbox_id=box["id"])["state"] not in ("running", "failed"):
        time.sleep(0.05)
    client.sandboxes.exec(sandbox_id=box["id"], argv=["true"], timeout_seconds=30)
    ready = time.monotonic() - started
    events = {e["type"]: _at(e["createdAt"])
              for e in client.events.list(subject=box["id"], limit=100)["items"]}
    if "sandbox.running" not in events:
        raise RuntimeError(f"{box['id']} failed: {client.sandboxes.get(sandbox_id=box['id'])}")
    out.append({"api": api,
                "delivery": events["sandbox.starting"] - events["sandbox.created"],
                "boot": events["sandbox.running"] - events["sandbox.starting"],
                "total": ready, "id": box["id"]})


def release_all(client: Any, boxes: list[dict[str, float]]) -> None:
    for box in boxes:
        client.sandboxes.release(sandbox_id=box["id"])
    for box in boxes:
        while client.sandboxes.get(sandbox_id=box["id"])["state"] not in ("stopped", "failed"):
            time.sleep(0.2)


def row(name: str, runs: list[dict[str, float]], baseline: float,
        cold: list[dict[str, float]]) -> dict[str, Any]:
    def p50(key: str, of: list[dict[str, float]] = runs) -> float:
        return statistics.median(r[key] for r in of)

    ordered = sorted(r["total"] for r in runs)
    return {"case": name, "n": len(runs), "api ms p50": f"{p50('api') * 1000:.0f}",
            "delivery s p50": f"{p50('delivery'):.2f}", "boot s p50": f"{p50('boot'):.2f}",
            "exec-ready s p50": f"{p50('total'):.2f}",
            "exec-ready s p99": f"{ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]:.2f}",
            "/ direct boot": f"{p50('total') / baseline:.2f}",
            "/ cold p50": f"{p50('total') / p50('total', cold):.2f}"}


def case(client: Any, pool: str, image: str, rounds: int
         ) -> tuple[list[dict[str, float]], list[dict[str, float]]]:
    """`rounds` sandboxes one at a time, then 8 at once."""
    serial: list[dict[str, float]] = []
    for _ in range(rounds):
        one(client, pool, image, serial)
        release_all(client, serial[-1:])
    burst: list[dict[str, float]] = []
    threads = [threading.Thread(target=one, args=(client, pool, image, burst))
               for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    release_all(client, burst)
    return serial, burst


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=5, help="Sandboxes one at a time.")
    args = parser.parse_args()
    from bcd.qemu import probe_accelerator
    from compute.client import Client
    from tests.e2e.conftest import start_stack, stop_stack

    with tempfile.TemporaryDirectory() as tmp:
        stack = start_stack(Path(tmp), "--sim", "1", "--sim-variant", "cpu",
                            env_extra={"BCD_VM_SHUTDOWN_SECONDS": "2"})
        try:
            client = Client(stack.env["BETTER_COMPUTE_URL"], stack.env["BETTER_COMPUTE_TOKEN"])
            pool = stack.env["CPU_POOL"]
            guest = stack.state_dir / "downloads"
            accel = probe_accelerator()
            direct = [direct_boot_seconds(guest / "guest-vmlinuz", guest / "guest-initrd.gz",
                                          accel) for _ in range(3)]
            baseline = statistics.median(direct)
            warm: list[dict[str, float]] = []
            for image in ("default", "snapshot"):  # the node fetches the image, makes the
                one(client, pool, image, warm)       # snapshot
                release_all(client, warm[-1:])
            cold = case(client, pool, "default", args.rounds)
            snap = case(client, pool, "snapshot", args.rounds)
        finally:
            stop_stack(stack)
    print(f"accelerator {accel}; direct QEMU boot of the same guest: "
          f"{', '.join(f'{s:.2f}' for s in direct)} s (median {baseline:.2f} s); the first "
          f"snapshot sandbox (the snapshot made): {warm[1]['total']:.2f} s")
    print(table([row("cold, 1 at a time", cold[0], baseline, cold[0]),
                 row("snapshot, 1 at a time", snap[0], baseline, cold[0]),
                 row("cold, 8 at once", cold[1], baseline, cold[1]),
                 row("snapshot, 8 at once", snap[1], baseline, cold[1])]))


if __name__ == "__main__":
    main()
