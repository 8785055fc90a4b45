"""This rank's progress for its node's watchdog: step and phase in a small mmap'd record, stacks on a signal.

``install`` (run by ``worker.py`` before the training script) maps ``rankN.progress`` in the launch directory
and registers ``faulthandler`` on ``heartbeat.STACK_SIGNAL`` to write every thread's stack to ``rankN.stacks``;
``beat(phase, step)`` rewrites the record in place (one ``struct.pack_into``: no system call). Outside a
launch, or with PPMULTI_HEARTBEAT=0, both do nothing.

PPMULTI_STALL=RANK:PHASE:STEP:SECONDS (or ``...:stop``) makes that rank sleep (or SIGSTOP itself) when it
enters PHASE at STEP: how the tests, and a user who wants to see the watchdog work, stall one rank.
"""

from __future__ import annotations

import faulthandler
import functools
import mmap
import os
import signal
import time
from typing import IO

from ppmulti.common import envvars as E
from ppmulti.common import heartbeat as H


class Heartbeat:
    """The mapped record of one rank."""

    def __init__(self, directory: str, rank: int, stall: str | None = None):
        path = H.record_path(directory, rank)
        with open(path, "wb") as f:
            f.write(H.pack(0, -1, time.time(), "start"))
        with open(path, "r+b") as f:
            self._map = mmap.mmap(f.fileno(), H.SIZE)
        self.beats = 0
        self.step = -1
        self.phase = "start"
        self._stall = _parse_stall(stall, rank)

    def beat(self, phase: str, step: int | None = None) -> None:
        if step is not None:
            self.step = step
        self.beats += 1
        self.phase = phase
        H.LAYOUT.pack_into(self._map, 0, self.beats, self.step, time.time(), H.PHASES.index(phase))
        if self._stall is not None and self._stall[:2] == (phase, self.step):
            how, self._stall = self._stall[2], None   # once: a phase re-entered after a collective is the same step
            _stall_here(how)


def _parse_stall(text: str | None, rank: int) -> tuple[str, int, str] | None:
    if not text:
        return None
    try:
        who, phase, step, how = text.split(":")
        if int(who) != rank or phase not in H.PHASES:
            return None
        return phase, int(step), how
    except ValueError:
        return None


def _stall_here(how: str) -> None:
    if how == "stop":
        signal.raise_signal(signal.SIGSTOP)
    else:
        time.sleep(float(how))


_current: Heartbeat | None = None
_stacks: IO[str] | None = None   # kept open: faulthandler writes to its descriptor from the signal handler
_fatal: IO[str] | None = None    # the same, for fatal signals (watch_paddle)


def install(environ=None) -> Heartbeat | None:
    """Start this rank's record and stack dumps when it runs under ``ppmulti launch``."""
    global _current, _stacks
    env = os.environ if environ is None else environ
    directory = env.get(E.PPMULTI_LAUNCH_DIR)
    if not directory or env.get(E.PPMULTI_HEARTBEAT, "1") == "0":
        return None
    rank = E.worker_info(env).rank
    try:
        _current = Heartbeat(directory, rank, env.get(E.PPMULTI_STALL))
        _stacks = open(H.stack_path(directory, rank), "w")
        faulthandler.register(H.STACK_SIGNAL, file=_stacks, all_threads=True, chain=False)
    except (OSError, ValueError, RuntimeError):
        _current = None
    return _current


def beat(phase: str, step: int | None = None) -> None:
    """Say that this rank entered ``phase`` (at global ``step``); cheap enough for every step."""
    if _current is not None:
        _current.beat(phase, step)


def current() -> Heartbeat | None:
    return _current


# paddle.distributed's collectives, wrapped by watch_collectives (the same names in Paddle 2.6 and 3.x)
COLLECTIVES = ("all_reduce", "all_gather", "all_gather_object", "broadcast", "barrier", "reduce")


def watch_paddle() -> list[str]:
    """After paddle is imported and the group joined: collectives report their phase (``watch_collectives``),
    and a fatal signal (gloo gives up on a peer by aborting the process) leaves the rank's stack in
    ``rankN.fatal``. faulthandler is enabled only now because Paddle's import installs its own handlers,
    which faulthandler then calls after writing."""
    global _fatal
    if _current is None:
        return []
    directory = os.environ.get(E.PPMULTI_LAUNCH_DIR)
    if directory:
        try:
            _fatal = open(H.fatal_path(directory, E.worker_info().rank), "w")
            faulthandler.enable(file=_fatal, all_threads=True)
        except (OSError, RuntimeError):
            pass
    return watch_collectives()



def watch_collectives() -> list[str]:
    """Report every call of paddle.distributed's collectives as "all-reduce", and the phase before it once
    it returns. ppdet's heads all-reduce inside the forward pass (PP-YOLOE's assigned-score sum, GFL, SimOTA,
    DETR: ``paddle.distributed.all_reduce`` looked up at each call), so a rank blocked there waits for its
    peers; without this it would look stalled in forward. Returns the names wrapped (none outside a launch)."""
    if _current is None:
        return []
    import paddle.distributed as pd

    wrapped = []
    for name in COLLECTIVES:
        fn = getattr(pd, name, None)
        if fn is not None and not getattr(fn, "_ppmulti_heartbeat", False):
            setattr(pd, name, _reported(fn))
            wrapped.append(name)
    return wrapped


def _reported(fn):
    @functools.wraps(fn)
    def collective(*args, **kwargs):
        beat_ = _current
        if beat_ is None:
            return fn(*args, **kwargs)
        before = beat_.phase
        beat_.beat("all-reduce")
        result = fn(*args, **kwargs)   # raising, it leaves "all-reduce": the rank ended in the collective
        beat_.beat(before)
        return result

    collective._ppmulti_heartbeat = True
    return collective
