"""A launch's states, the one object that holds them while it runs, and its frozen result (``LOG_DIR/result.json``).

Like torch elastic's agent (``WorkerState``, ``RunResult``), but named for what ``runner.py`` does: it meets the
other nodes (RENDEZVOUS), runs Paddle's launcher and watches the ranks (RUNNING), starts every rank again after a
failure under ``--max_restarts`` (RESTARTING), and ends in one of five states: SUCCEEDED, FAILED (a rank failed or
was killed, a node left, the rendezvous did not complete), HUNG (the hang watchdog stopped the ranks), REFUSED
(every rank refused its input before training started: exit 2) or INTERRUPTED (SIGINT/SIGTERM reached the
launcher, which forwarded it; exit 128 + the signal).

``result.json`` is for schedulers and CI: the final state, the launcher's exit code, each of this node's ranks'
exit codes or signal names, the restarts used, the duration, the one-line cause of a failure and the run
directory. It holds no environment value (the cause lines are the ones the console shows, already redacted).
"""

from __future__ import annotations

import enum
import json
import os
import signal
import time
from types import MappingProxyType
from dataclasses import dataclass, field
from typing import Callable, Mapping

from ppmulti.common.atomic import atomic_write_text

RESULT_FILE = "result.json"   # in the launch's log directory
RankExit = int | str          # an exit code, or the name of the signal that killed the rank ("SIGKILL")


class LaunchState(str, enum.Enum):
    """Where a launch is; the last five are final."""

    INIT = "INIT"
    RENDEZVOUS = "RENDEZVOUS"
    RUNNING = "RUNNING"
    RESTARTING = "RESTARTING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    HUNG = "HUNG"
    REFUSED = "REFUSED"
    INTERRUPTED = "INTERRUPTED"

    @property
    def final(self) -> bool:
        return self in FINAL


FINAL = frozenset({LaunchState.SUCCEEDED, LaunchState.FAILED, LaunchState.HUNG, LaunchState.REFUSED,
                   LaunchState.INTERRUPTED})
_S = LaunchState
# a move not listed is a bug in the runner, not the user's doing: Launch.to raises on it
MOVES: Mapping[LaunchState, frozenset[LaunchState]] = {
    _S.INIT: frozenset({_S.RENDEZVOUS, _S.RUNNING} | FINAL),
    _S.RENDEZVOUS: frozenset({_S.RUNNING, _S.RESTARTING} | FINAL),
    _S.RUNNING: frozenset({_S.RESTARTING} | FINAL),
    _S.RESTARTING: frozenset({_S.RENDEZVOUS, _S.RUNNING} | FINAL),
    **{state: frozenset() for state in FINAL},
}


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


@dataclass(frozen=True)
class RunResult:
    """How a launch ended on this node. ``ranks``: this node's ranks (global rank -> exit code or signal name)."""

    state: LaunchState
    exit_code: int
    ranks: Mapping[int, RankExit] = field(default_factory=dict)
    restarts: int = 0
    duration: float = 0.0
    cause: str | None = None
    run_dir: str | None = None
    signal: str | None = None   # the signal the launcher received, when one stopped it

    @property
    def failed(self) -> bool:
        return self.state is not LaunchState.SUCCEEDED

    def to_json(self) -> str:
        data = {"state": self.state.value, "exit_code": self.exit_code,
                "ranks": {str(r): self.ranks[r] for r in sorted(self.ranks)}, "restarts": self.restarts,
                "duration": round(self.duration, 3), "cause": self.cause, "run_dir": self.run_dir,
                "signal": self.signal}
        return json.dumps(data, indent=2) + "\n"

    def write(self, log_dir: str) -> str:
        """Write ``log_dir/result.json`` atomically; return its path."""
        path = os.path.join(log_dir, RESULT_FILE)
        atomic_write_text(path, self.to_json())
        return path


class Launch:
    """The launch's state while it runs: what the runner's mutable cells held (the signal forwarded, the abort
    reason), the restarts used and the last start's rank exits, each move of ``state`` checked against ``MOVES``."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self._clock = clock
        self.started = clock()
        self.state = LaunchState.INIT
        self.signum: int | None = None         # the first signal the launcher received and forwarded
        self.abort_reason: str | None = None   # why the rendezvous ended the running attempt (a node left)
        self.hung = False                      # the hang watchdog stopped this attempt's ranks
        self.refused = False                   # every rank refused its input before training started
        self.restarts = 0                      # restarts used (an elastic round number can be higher)
        self.cause: str | None = None
        self.ranks: dict[int, RankExit] = {}
        self.run_dir: str | None = None

    def to(self, state: LaunchState) -> None:
        if state is not self.state and state not in MOVES[self.state]:
            raise RuntimeError(f"launch state {self.state.value} cannot move to {state.value}")
        self.state = state

    def interrupt(self, signum: int) -> bool:
        """Note a signal the launcher received; True for the first one (the one the ranks are told of)."""
        first = self.signum is None
        if first:
            self.signum = signum
        return first

    @property
    def interrupted(self) -> bool:
        return self.signum is not None

    def restart(self) -> None:
        """Another start of every rank after this attempt failed."""
        self.to(LaunchState.RESTARTING)
        self.restarts += 1
        self.abort_reason, self.hung = None, False

    def end(self, state: LaunchState, exit_code: int, cause: str | None = None) -> RunResult:
        """Move to the final ``state`` and freeze the result (``cause``: the one line that ended it, when it is
        not the one the ranks left)."""
        if not state.final:
            raise RuntimeError(f"{state.value} is not a final state")
        self.to(state)
        if cause is not None:
            self.cause, self.abort_reason = cause, None
        cause = None if state is LaunchState.SUCCEEDED else (self.abort_reason or self.cause)
        return RunResult(state, exit_code, MappingProxyType(dict(self.ranks)), self.restarts,
                         self._clock() - self.started, cause, self.run_dir,
                         signal_name(self.signum) if self.signum is not None else None)


def final_state(exit_code: int, launch: Launch) -> LaunchState:
    """The final state an exit code means, given what the launch saw (a signal, the watchdog)."""
    if exit_code == 0:
        return LaunchState.SUCCEEDED
    if launch.interrupted:
        return LaunchState.INTERRUPTED
    if launch.refused:
        return LaunchState.REFUSED
    return LaunchState.HUNG if launch.hung else LaunchState.FAILED
