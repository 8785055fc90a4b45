"""This machine's cores, each rank's share of them and the CPU's feature flags; no paddle import.

The launcher and the bench read it too, so it stays free of paddle.
"""

from __future__ import annotations

import os

from ppmulti.common.envvars import PPMULTI_CPU_THREADS
from ppmulti.common.errors import UserError


# ``ppmulti yolo`` runs leave one core out of the ranks' threads, as ultralytics does on a CPU (its select_device:
# torch threads = cores - 1, at most 8; its trainer loads in the training process, workers=0). One process on 2
# idle cores, 160 px, 20 epochs (bench/results/ultra_threads.md): YOLOv8n / YOLO11n / YOLO26n 134 / 143 / 155 s
# on 1 thread, 145 / 164 / 204 s on 2, ultralytics 123 / 134 / 147 s. The nano models' many small operators lose
# more to waking a second thread than they gain from it.
ULTRALYTICS_SPARE_CORES = 1


def choose_cpu_threads(cores: int, local_ranks: int, override: str | None = None, spare: int = 0) -> int:
    """Compute threads for each rank: this machine's cores, less ``spare``, shared evenly by its ranks (at least
    1), unless ``override`` (PPMULTI_CPU_THREADS) names a number.

    The count does not follow the machine's momentary load: a run's threading stays the same from one start
    to the next. On a machine shared with other work, set PPMULTI_CPU_THREADS=1 (bench/PERF.md: one rank ran
    at half speed with 2 threads against 1 on 2 fully busy cores; on quiet cores 2 threads gain ~1.2x).
    """
    if override is not None and override.strip():
        text = override.strip()
        if not text.isdigit() or int(text) < 1:
            raise UserError(f"{PPMULTI_CPU_THREADS}={override!r}: expected a whole number of threads >= 1")
        return int(text)
    return max(1, (max(1, cores) - max(0, spare)) // max(1, local_ranks))


def usable_cores() -> int:
    """Cores this process may run on (its affinity mask, e.g. under taskset or a container's cpuset)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def cpu_flags(cpuinfo: str | None = None) -> frozenset[str]:
    """The first processor's feature flags in /proc/cpuinfo (``avx512_bf16``, ``amx_bf16``, ...); empty when
    unreadable (not Linux)."""
    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
                cpuinfo = f.read()
        except OSError:
            return frozenset()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return frozenset()
