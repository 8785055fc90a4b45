"""The progress record each rank keeps in its launch directory for its node's watchdog: layout, phases, reading."""

from __future__ import annotations

import os
import signal
import struct
from dataclasses import dataclass

# What a rank is doing. A rank in a WAITING phase may be blocked on its peers (the gradient all-reduce runs
# inside backward in Paddle's DataParallel; "start" covers joining the group and the first broadcast; "done"
# the exit), so a rank that stops there is a victim until shown otherwise. A rank that stops in any other
# phase stopped by itself.
PHASES = ("start", "data", "forward", "backward", "all-reduce", "evaluation", "checkpoint", "done")
WAITING = frozenset({"start", "backward", "all-reduce", "done"})

# beats (each phase change or report adds one), step, wall time, phase index; rewritten in place (mmap)
LAYOUT = struct.Struct("<QqdI")
SIZE = 32
STACK_SIGNAL = signal.SIGUSR2   # faulthandler in each rank dumps every thread's Python stack on it


@dataclass(frozen=True)
class Progress:
    """One reading of a rank's record."""

    beats: int
    step: int          # the trainer's global step (-1 before the first)
    time: float        # time.time() of the last beat
    phase: str


def record_path(directory: str, rank: int) -> str:
    return os.path.join(directory, f"rank{rank}.progress")


def stack_path(directory: str, rank: int) -> str:
    return os.path.join(directory, f"rank{rank}.stacks")


def fatal_path(directory: str, rank: int) -> str:
    """Where faulthandler writes the rank's stack when it dies of SIGABRT/SIGSEGV (gloo aborts this way)."""
    return os.path.join(directory, f"rank{rank}.fatal")


def fatal(directory: str, rank: int) -> str | None:
    """The first line of the rank's fatal-signal report (``Fatal Python error: Aborted``), None if it has none."""
    try:
        with open(fatal_path(directory, rank), errors="replace") as f:
            first = f.readline().strip()
    except OSError:
        return None
    return first or None


def pack(beats: int, step: int, when: float, phase: str) -> bytes:
    return LAYOUT.pack(beats, step, when, PHASES.index(phase)).ljust(SIZE, b"\0")


def read(directory: str, rank: int) -> Progress | None:
    """The record of ``rank``; None when it has none yet (or it is unreadable)."""
    try:
        with open(record_path(directory, rank), "rb") as f:
            data = f.read(SIZE)
    except OSError:
        return None
    if len(data) < LAYOUT.size:
        return None
    beats, step, when, phase = LAYOUT.unpack_from(data)
    return Progress(beats, step, when, PHASES[phase] if phase < len(PHASES) else "start")
