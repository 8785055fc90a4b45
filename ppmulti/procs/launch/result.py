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

``ppmulti launch --nodes`` writes one more, in the log directory of the shell that fanned out: the overall state
and each node's (``combine``, pure: each node's own result.json where it can be read here, else its ssh exit).
"""

from __future__ import annotations

import enum
import json
import os
import signal
import time
from types import MappingProxyType
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from ppmulti.common.atomic import atomic_write_text
from ppmulti.common.errors import UserError

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


# --- the fan-out's combined result (ppmulti launch --nodes) ---------------------------------------------------
SSH_LOST = 255   # ssh's own exit status: the connection failed or was lost


@dataclass(frozen=True)
class NodeEnd:
    """How one node of a fan-out ended, as the shell that fanned out saw it."""

    name: str                          # "node1 10.0.0.2"
    ssh_exit: int | None               # the session's exit status (None: it had not ended)
    duration: float                    # the session's wall time, measured by the fan-out
    stopped: bool = False              # the fan-out stopped it (another node failed, or a signal)
    result: Mapping[str, Any] | None = None   # the node's own result.json, when it can be read here and is new


def node_summary(end: NodeEnd) -> dict[str, Any]:
    """One node's entry in the combined result: its own result.json's state, exit code, restarts, duration, cause
    and run directory when read here (and, for a node that ended by itself, agreeing with its ssh exit: the
    launcher's exit is the session's), else what the ssh exit says (``source`` names which)."""
    own = end.result
    if own is not None and own.get("state") in LaunchState.__members__ and isinstance(own.get("exit_code"), int) \
            and (end.stopped or own["exit_code"] == end.ssh_exit):
        return {"node": end.name, "state": own["state"], "exit_code": own["exit_code"], "ssh_exit": end.ssh_exit,
                "restarts": own.get("restarts", 0), "duration": own.get("duration", round(end.duration, 3)),
                "cause": own.get("cause"), "run_dir": own.get("run_dir"), "source": RESULT_FILE}
    code = end.ssh_exit
    if code == 0:
        state, cause = LaunchState.SUCCEEDED, None
    elif end.stopped:
        state, cause = LaunchState.INTERRUPTED, "stopped by the fan-out"
    elif code == UserError.exit_code:
        state, cause = LaunchState.REFUSED, "its launch refused its input (exit 2)"
    elif code == SSH_LOST:
        state, cause = LaunchState.FAILED, "ssh exit 255: the connection failed or was lost"
    else:
        state, cause = LaunchState.FAILED, "the session had not ended" if code is None else f"exited with code {code}"
    return {"node": end.name, "state": state.value, "exit_code": code, "ssh_exit": code, "restarts": None,
            "duration": round(end.duration, 3), "cause": cause, "run_dir": None, "source": "ssh"}


@dataclass(frozen=True)
class NodesResult:
    """How a fan-out over ssh ended: the overall state and exit code, and each node's entry (``node_summary``)."""

    state: LaunchState
    exit_code: int
    nodes: tuple[Mapping[str, Any], ...]
    duration: float
    cause: str | None = None
    signal: str | None = None
    job: str | None = None

    def to_json(self) -> str:
        data = {"state": self.state.value, "exit_code": self.exit_code, "duration": round(self.duration, 3),
                "cause": self.cause, "signal": self.signal, "job": self.job, "nodes": [dict(n) for n in self.nodes]}
        return json.dumps(data, indent=2) + "\n"

    def write(self, log_dir: str) -> str:
        """Write ``log_dir/result.json`` atomically; return its path."""
        path = os.path.join(log_dir, RESULT_FILE)
        atomic_write_text(path, self.to_json())
        return path


def combine(ends: Sequence[NodeEnd], exit_code: int, duration: float, failed: int | None = None,
            signal: str | None = None, job: str | None = None) -> NodesResult:
    """The fan-out's result from its nodes' (pure; golden cases in tests/test_launch_result.py). A signal to the
    fan-out: INTERRUPTED. A node that failed (``failed``, the one that stopped the others): its own final state
    (REFUSED, HUNG, FAILED...), its cause named. Every node SUCCEEDED: SUCCEEDED."""
    nodes = tuple(node_summary(end) for end in ends)
    if signal is not None:
        state, cause = LaunchState.INTERRUPTED, f"{signal}: the fan-out stopped every node"
    elif failed is not None:
        node = nodes[failed]
        own = LaunchState(node["state"])
        state = own if own.final and own is not LaunchState.SUCCEEDED else LaunchState.FAILED
        cause = f"{node['node']}: " + (node["cause"] or f"exited with code {node['exit_code']}")
    elif all(n["state"] == LaunchState.SUCCEEDED.value for n in nodes):
        state, cause = LaunchState.SUCCEEDED, None
    else:
        state, cause = LaunchState.FAILED, next(f"{n['node']}: {n['cause']}" for n in nodes
                                                if n["state"] != LaunchState.SUCCEEDED.value)
    return NodesResult(state, exit_code, nodes, duration, cause, signal, job)
