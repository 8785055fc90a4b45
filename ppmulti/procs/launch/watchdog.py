"""The hang watchdog of one node: names the rank that stopped making progress, its phase, and writes every stack.

Each rank keeps a small progress record in the launch directory (``ppmulti.rank.heartbeat``: beats, step,
phase). The runner calls ``poll`` every 0.1 s; every ``SAMPLE`` seconds it reads the records and each rank's CPU
time (the rank's and its descendants', so data-loader workers and a compiler count). A rank is *active* when
its record moved or it used CPU; a rank blocked in a collective uses none, nor does a stopped or sleeping one.

A rank is named as stalled when it has been idle for ``timeout`` seconds and it is stopped (``T``, e.g. SIGSTOP)
or idle in a phase that does not wait for peers (data, forward, evaluation, checkpoint). When every rank of the
world is on this node and all wait, the ones furthest behind (step, phase) are named; when they are level, all
are (a collective that not every rank entered). Ranks that merely wait are named as victims, never as the
cause. A node whose ranks all wait for a rank on another node does not fire: that node's watchdog does,
its ranks stop, and the ranks here lose their peer, which ``explain_exit`` reports as such.

A rank can also die while waiting before ``timeout`` (gloo's fixed 30 s collective timeout): then a live rank
here that is stopped, or idle ``DEATH_IDLE`` seconds outside a waiting phase, is the cause.

Firing: each live rank gets ``heartbeat.STACK_SIGNAL`` (faulthandler writes every thread's stack; a stopped
rank also gets SIGCONT so the handler runs), the stacks are copied to ``LOG_DIR/stacks.rankN.txt``, and the
runner stops every rank, then restarts them under ``--max_restarts`` or gives up.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass, field
from typing import Callable

from ppmulti.common import heartbeat as H
from ppmulti.common import procfs
from ppmulti.common.atomic import atomic_write_text
from ppmulti.common.shm import paddle_shm_of
from ppmulti.procs import supervisor

SAMPLE = 0.5        # seconds between samples
BUSY_CPU = 0.05     # CPU seconds within one sample that count as work (a rank blocked in gloo uses ~0.002)
DEATH_IDLE = 5.0    # a peer died waiting: a live rank idle this long outside a waiting phase is the cause
STACK_WAIT = 10.0   # seconds to wait for the stack files to be written
# How a rank's Python error reads when a collective failed because a peer went away or never came
# (gloo: "TIMEOUT ... pair_rank", "Connection reset by peer"; NCCL: "NCCL ... timeout"), lower case
PEER_ERRORS = ("gloo", "nccl", "timeout", "connection reset", "connection closed", "broken pipe", "socket closed")


def peer_error(text: str) -> bool:
    """Whether a rank's failure text says that a collective lost its peer (not a bug of its own)."""
    low = text.lower()
    return any(marker in low for marker in PEER_ERRORS)


def lost_a_peer(failed: str, fatal: str | None) -> bool:
    """Whether a rank's end reads as a victim's: its Python error says a collective lost its peer, or it aborted
    (gloo's IoException on Paddle 2.6 is thrown where Python cannot catch it: the process aborts)."""
    return peer_error(failed) or (fatal is not None and "Aborted" in fatal)


@dataclass
class _Rank:
    rank: int
    pid: int
    active: float                       # monotonic time of the last sign of life
    beats: int = -1
    cpu: float = 0.0
    progress: H.Progress | None = None
    state: str | None = None
    pids: set[int] = field(default_factory=set)   # every process of the rank seen (for its shared memory)
    gone: bool = False

    def where(self) -> str:
        p = self.progress
        if p is None:
            return "before its first report"
        return f"in {p.phase}" + (f" at step {p.step}" if p.step >= 0 else "")

    def order(self) -> tuple[int, int]:
        p = self.progress
        return (-1, 0) if p is None else (p.step, H.PHASES.index(p.phase))


def _seconds(x: float) -> str:
    return f"{x:.0f}s"


class Watchdog:
    """Watches this node's ranks; ``fired`` holds the diagnosis once it named a stalled rank."""

    def __init__(self, directory: str, timeout: float, node_rank: int = 0, nnodes: int = 1,
                 local_world: bool = True, log_dir: str | None = None, log: Callable[[str], None] | None = None):
        self.directory = directory
        self.timeout = timeout
        self.node_rank = node_rank
        self.nnodes = nnodes
        self.local_world = local_world    # every rank of the world runs on this node
        self.log_dir = log_dir or "log"
        self.log = log or (lambda _msg: None)
        self.ranks: dict[int, _Rank] = {}
        self.fired: str | None = None
        self.stack_files: list[str] = []
        self._next = 0.0

    # ----------------------------------------------------------------- sampling
    def poll(self, started: dict[int, int], now: float | None = None) -> bool:
        """Sample if due; True once a stalled rank was named (the caller then stops the launch)."""
        if self.fired is not None:
            return True
        now = time.monotonic() if now is None else now
        if now < self._next:
            return False
        self._next = now + SAMPLE
        died_waiting = self._sample(started, now)
        stalled = self._stalled(now, died_waiting)
        if stalled:
            self._fire(stalled, now, died_waiting)
        return self.fired is not None

    def _sample(self, started: dict[int, int], now: float) -> list[_Rank]:
        died_waiting = []
        for rank, pid in started.items():
            r = self.ranks.get(rank)
            if r is None or r.pid != pid:
                r = self.ranks[rank] = _Rank(rank, pid, active=now)
            if r.gone:
                continue
            state = procfs.state(pid)
            if state is None:
                r.gone = True
                r.progress = H.read(self.directory, rank) or r.progress   # where it was when it ended
                # ended in a collective: killed there (no mark) or failed there for want of its peer
                failed = self._failed(rank)
                if (not self._marked(rank) and r.progress is not None and r.progress.phase in H.WAITING
                        and (failed is None or peer_error(failed))):
                    died_waiting.append(r)
                continue
            tree = procfs.tree(pid)
            r.pids.update(tree)
            cpu = procfs.cpu_seconds(tree)
            progress = H.read(self.directory, rank)
            beats = -1 if progress is None else progress.beats
            if beats != r.beats or cpu - r.cpu >= BUSY_CPU:
                r.active = now
            r.beats, r.cpu, r.progress, r.state = beats, cpu, progress, state
        return died_waiting

    def _failed(self, rank: int) -> str | None:
        try:
            with open(os.path.join(self.directory, f"rank{rank}.failed")) as f:
                return f.read().strip()
        except OSError:
            return None

    def _marked(self, rank: int) -> bool:
        return any(os.path.exists(os.path.join(self.directory, f"rank{rank}.{kind}")) for kind in ("done", "stopped"))

    # ----------------------------------------------------------------- deciding
    def _live(self) -> list[_Rank]:
        return [r for r in self.ranks.values() if not r.gone]

    def _stalled(self, now: float, died_waiting: list[_Rank]) -> list[_Rank]:
        live = self._live()
        if died_waiting:
            # a peer gave up waiting (gloo's own timeout, a lost connection): is the one it waited for here?
            return [r for r in live if r.state == "T"
                    or (now - r.active >= DEATH_IDLE and r.progress is not None and r.progress.phase not in H.WAITING)]
        if self.timeout <= 0 or not live:
            return []
        idle = [r for r in live if now - r.active >= self.timeout]
        stalled = [r for r in idle if r.state == "T" or (r.progress is not None and r.progress.phase not in H.WAITING)]
        if stalled or not self.local_world or len(idle) < len(live):
            return stalled
        # every rank of the world waits: the ones behind did not reach the collective the others are in
        lowest = min(r.order() for r in idle)
        return [r for r in idle if r.order() == lowest]

    def _fire(self, stalled: list[_Rank], now: float, died_waiting: list[_Rank]) -> None:
        names = ", ".join(f"rank {r.rank}" for r in stalled)
        parts = []
        for r in stalled:
            how = " (stopped: SIGSTOP or a debugger)" if r.state == "T" else ""
            parts.append(f"rank {r.rank} on node {self.node_rank} made no progress for "
                         f"{_seconds(now - r.active)} {r.where()}{how}")
        others = [r for r in self._live() if r not in stalled]
        victims = [f"rank {r.rank} waits {r.where()}" for r in others]
        victims += [f"rank {r.rank} gave up waiting {r.where()} (lost its peer)" for r in died_waiting]
        if len(stalled) > 1 and not others and not died_waiting:
            parts.append("every rank waits at the same point: a collective that not every rank entered")
        text = "; ".join(parts)
        if victims:
            text += "; " + "; ".join(victims) + " (waiting for " + names + ", not a cause)"
        self.fired = f"hang: {text}"
        self.stack_files = self._dump_stacks()
        if self.stack_files:
            self.fired += f"; Python stacks in {', '.join(self.stack_files)}"

    # ----------------------------------------------------------------- stacks
    def _dump_stacks(self) -> list[str]:
        live = self._live()
        sizes = {}
        for r in live:
            sizes[r.rank] = _size(H.stack_path(self.directory, r.rank))
            supervisor.signal_pids([r.pid], H.STACK_SIGNAL)
            if r.state == "T":
                supervisor.signal_pids([r.pid], signal.SIGCONT)
        deadline = time.monotonic() + STACK_WAIT
        pending = {r.rank for r in live}
        while pending and time.monotonic() < deadline:
            time.sleep(0.1)
            pending = {k for k in pending if _size(H.stack_path(self.directory, k)) <= sizes[k]}
        time.sleep(0.2)   # faulthandler writes thread by thread: let the last one finish
        written = []
        for r in sorted(live, key=lambda r: r.rank):
            try:
                with open(H.stack_path(self.directory, r.rank), errors="replace") as f:
                    f.seek(sizes[r.rank])
                    text = f.read()
            except OSError:
                continue
            if not text.strip():
                continue
            os.makedirs(self.log_dir, exist_ok=True)
            path = os.path.join(self.log_dir, f"stacks.rank{r.rank}.txt")
            atomic_write_text(path, f"rank {r.rank} (pid {r.pid}) {r.where()}\n{text}")
            written.append(path)
        return written

    # ----------------------------------------------------------------- after the launch
    def explain_exit(self, first_gone: int | None, failed: dict[int, str]) -> str | None:
        """Why the launch failed when the watchdog did not fire, if it knows better than "rank N died": a rank
        whose collective failed for want of a peer on another node (its Python error says so: a rank killed
        while waiting leaves none, and is the cause) is named as a victim, with the cause elsewhere."""
        if self.fired is not None:
            return self.fired
        r = self.ranks.get(first_gone) if first_gone is not None else None
        if r is None or self.local_world or r.progress is None or r.progress.phase not in H.WAITING:
            return None
        text = failed.get(r.rank, "")
        if not lost_a_peer(text, H.fatal(self.directory, r.rank)):
            return None
        how = f" ({text})" if peer_error(text) else " (it aborted: gloo gives up on a peer that way)"
        return (f"rank {r.rank} on node {self.node_rank} lost its peer {r.where()}{how}: it is a victim; "
                f"the cause is on another node (see that node's output)")

    def shared_memory_left(self, shm_dir: str = "/dev/shm") -> list[str]:
        """Paddle's data-loader shared memory (``paddle_<pid>_...``, named by the writing worker) of every
        process of these ranks that is gone."""
        gone = {p for r in self.ranks.values() for p in r.pids if not procfs.alive(p)}
        return paddle_shm_of(gone, shm_dir)


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0
