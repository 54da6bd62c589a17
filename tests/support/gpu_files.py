"""GPU device files under a simulated machine's root: real character devices with NVIDIA's
major number (no driver answers them: opening one gives ENXIO, unless a device cgroup
denies it first, EPERM), so a runtime or Slurm handles them as it handles a GPU's."""

from __future__ import annotations

import os
from pathlib import Path

NVIDIA_MAJOR = 195
CONTROL_MINOR = 255  # /dev/nvidiactl


def make_gpu_files(root: Path, count: int) -> None:
    """/dev/nvidia0..N-1 and /dev/nvidiactl under `root`, as the driver makes them (in
    place of the plain files a simulated machine has there)."""
    dev = root / "dev"
    dev.mkdir(exist_ok=True)
    for name, minor in [*((f"nvidia{i}", i) for i in range(count)),
                        ("nvidiactl", CONTROL_MINOR)]:
        if not (dev / name).is_char_device():
            (dev / name).unlink(missing_ok=True)
            os.mknod(dev / name, 0o666 | 0o020000, os.makedev(NVIDIA_MAJOR, minor))
