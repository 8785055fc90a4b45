"""The one place that starts, signals, stops and reaps child processes, and names how they ended.

Every process ppmulti starts goes through here: ``start`` (a child, by default in a session of its own so that
one signal reaches its whole group and nothing of ours), ``run`` (a short command whose output is wanted, such as
an ssh preflight), ``forward_signals`` (SIGINT/SIGTERM/SIGHUP to ppmulti reach the children while a block runs),
``Child.stop`` (SIGTERM to the group, a grace period, SIGKILL), ``sweep`` (processes that left the group, found by
an environment tag in ``/proc``) and ``stop_tree`` (both, in that order). ``cause`` names an exit: ``exit code 3``
or ``killed by signal SIGKILL``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import IO, Any, Callable, Iterable, Iterator, Mapping, Sequence, Union

from ppmulti.common import procfs

DEVNULL = subprocess.DEVNULL
PIPE = subprocess.PIPE
STDOUT = subprocess.STDOUT

GRACE = 15.0          # seconds between SIGTERM and SIGKILL: enough for Paddle's launcher to stop its workers
KILL_WAIT = 5.0       # seconds to wait for a SIGKILLed group's leader before giving up on reaping it
SWEEP_GRACE = 3.0     # seconds tagged processes get between SIGTERM and SIGKILL
KILL_ROUNDS = 20      # SIGKILL rounds of a sweep, 0.25 s apart: a process may fork while it is being killed
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)

Stream = Union[int, IO[Any], None]


def cause(returncode: int) -> str:
    """How a process ended, from its Popen return code: ``exit code N`` or ``killed by signal NAME``."""
    if returncode >= 0:
        return f"exit code {returncode}"
    try:
        name = signal.Signals(-returncode).name
    except ValueError:
        name = str(-returncode)
    return f"killed by signal {name}"


class Child:
    """A started process: wait for it, signal it (its whole group when it has its own), stop it, reap it."""

    def __init__(self, popen: subprocess.Popen, own_group: bool):
        self.popen = popen
        self.own_group = own_group

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def stdin(self) -> IO[bytes] | None:
        return self.popen.stdin

    @property
    def stdout(self) -> IO[bytes] | None:
        return self.popen.stdout

    @property
    def stderr(self) -> IO[bytes] | None:
        return self.popen.stderr

    @property
    def returncode(self) -> int | None:
        """The Popen return code once reaped (-N: killed by signal N), None while it runs."""
        return self.popen.returncode

    @property
    def exit_code(self) -> int | None:
        """The return code as a shell reports it (killed by signal N -> 128 + N), None while it runs."""
        return None if self.popen.returncode is None else procfs.exit_code(self.popen.returncode)

    def poll(self) -> int | None:
        return self.popen.poll()

    def wait(self, timeout: float | None = None) -> int | None:
        """The return code once it ends; None if it still runs after ``timeout`` seconds."""
        try:
            return self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def signal(self, sig: int, group: bool | None = None) -> bool:
        """Send ``sig`` to the child's group (default when it has its own) or to the child alone; False if gone."""
        try:
            if self.own_group if group is None else group:
                os.killpg(self.pid, sig)
            else:
                self.popen.send_signal(sig)   # checks that the child is not reaped: never a reused pid
        except ProcessLookupError:
            return False
        return True

    def stop(self, grace: float = GRACE, kill_wait: float = KILL_WAIT) -> int | None:
        """SIGTERM the group, wait up to ``grace`` for the child, then SIGKILL the group; the return code
        (None: still not reaped ``kill_wait`` seconds after SIGKILL)."""
        for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, kill_wait)):
            if self.poll() is not None or not self.signal(sig):
                break
            if self.wait(wait) is not None:
                break
        return self.returncode

    def cause(self) -> str:
        """How it ended (see ``cause``); ``running`` while it runs."""
        return "running" if self.poll() is None else cause(self.popen.returncode)


def start(argv: Sequence[str], *, env: Mapping[str, str] | None = None, cwd: str | os.PathLike | None = None,
          stdin: Stream = None, stdout: Stream = None, stderr: Stream = None, new_session: bool = True,
          parent_death_signal: int | None = None) -> Child:
    """Start ``argv``; ``new_session``: in a session and process group of its own, so a Ctrl-C on the terminal
    reaches only ppmulti, which decides what the child gets, and one signal reaches the child's whole group.
    ``parent_death_signal``: Linux sends the child this signal when the thread that started it ends, the whole
    process killed by SIGKILL included (``prctl(PR_SET_PDEATHSIG)``, set in the child before it runs ``argv``;
    elsewhere than Linux nothing is set). Start such a child from a thread that waits for it.
    Raises OSError (FileNotFoundError, PermissionError) when it cannot start."""
    preexec = None if parent_death_signal is None else _die_with_parent(int(parent_death_signal), os.getpid())
    popen = subprocess.Popen(list(argv), env=None if env is None else dict(env), cwd=cwd, stdin=stdin,
                             stdout=stdout, stderr=stderr, start_new_session=new_session, preexec_fn=preexec)
    return Child(popen, own_group=new_session)


PR_SET_PDEATHSIG = 1


def _die_with_parent(sig: int, parent: int) -> Callable[[], None] | None:
    """A preexec function that asks Linux for ``sig`` when the parent dies (None where prctl is not to be had).
    The C function is looked up here, before the fork, so the child only calls it; a parent already gone by then
    (the child was re-parented) makes the child send itself the signal at once."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0)
        if os.getppid() != parent:
            os.kill(os.getpid(), sig)

    return preexec


@dataclass(frozen=True)
class Ran:
    """A short command's outcome: its return code (None: killed at the timeout) and its output."""

    code: int | None
    stdout: str
    stderr: str


def _text(data: str | bytes | None) -> str:
    # TimeoutExpired carries bytes even under text=True
    if isinstance(data, bytes):
        return data.decode(errors="replace")
    return data or ""


def run(argv: Sequence[str], timeout: float, *, env: Mapping[str, str] | None = None,
        cwd: str | os.PathLike | None = None) -> Ran:
    """Run a short command with stdin from /dev/null and its output captured as text; kill it at ``timeout``.
    Raises FileNotFoundError when the program is missing."""
    try:
        proc = subprocess.run(list(argv), stdin=DEVNULL, capture_output=True, text=True, errors="replace",
                              timeout=timeout, env=None if env is None else dict(env), cwd=cwd)
    except subprocess.TimeoutExpired as exc:
        return Ran(None, _text(exc.stdout), _text(exc.stderr))
    return Ran(proc.returncode, proc.stdout, proc.stderr)


@contextlib.contextmanager
def forward_signals(to: Sequence[Child] | Callable[[int], None],
                    signals: Iterable[int] = STOP_SIGNALS) -> Iterator[list[int]]:
    """While the block runs, each of ``signals`` that reaches ppmulti goes to ``to``: every child in the list
    (read when the signal comes, so children may be added), each to its group, or a callback given the
    signal number. Yields the signals caught, in order; the previous handlers come back afterwards.

    Only the main thread may handle signals: elsewhere nothing is installed and the caller's own caller
    (which is on the main thread) decides.
    """
    caught: list[int] = []

    def handler(signum: int, _frame: Any) -> None:
        caught.append(signum)
        if callable(to):
            to(signum)
            return
        for child in list(to):
            child.signal(signum)

    previous = {}
    if threading.current_thread() is threading.main_thread():
        previous = {sig: signal.signal(sig, handler) for sig in signals}
    try:
        yield caught
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def signal_pids(pids: Iterable[int], sig: int) -> None:
    """Send ``sig`` to each pid; one already gone, or another user's, is skipped."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


@dataclass(frozen=True)
class Swept:
    """What a sweep did: SIGKILLs sent (a process is counted once per round it survived), and pids still alive."""

    killed: int
    left: list[int]


def sweep(key: str, value: str, *, grace: float = SWEEP_GRACE, sid: int | None = None,
          cmdline_mark: bytes | None = None, first: Sequence[int] | None = None, poll: float = 0.1) -> Swept:
    """Stop every live process of this user whose environment has ``key=value`` (and those in session ``sid``,
    and those whose command line contains ``cmdline_mark``; see ``procfs.tagged``), however they left their
    group: SIGTERM to ``first`` when given (a process that passes it on in order), else to all of them; wait
    up to ``grace`` for every one to go; then SIGKILL what is left, in rounds."""
    def find() -> list[int]:
        return procfs.tagged(key, value, sid, cmdline_mark)

    signal_pids(find() if first is None else first, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and find():
        time.sleep(poll)
    killed = 0
    for _ in range(KILL_ROUNDS):
        left = find()
        if not left:
            break
        killed += len(left)
        signal_pids(left, signal.SIGKILL)
        time.sleep(0.25)
    return Swept(killed, find())


def stop_tree(child: Child, grace: float, key: str, value: str, *, sweep_grace: float = SWEEP_GRACE,
              cmdline_mark: bytes | None = None) -> Swept:
    """Stop ``child`` and every process tagged ``key=value``: SIGTERM the child's group and give it ``grace``
    to stop what it started in order; then sweep the tagged processes (those in sessions of their own
    included); SIGKILL the child if it is still there; reap it."""
    if child.poll() is None:
        child.signal(signal.SIGTERM)
        child.wait(grace)
    swept = sweep(key, value, grace=sweep_grace, cmdline_mark=cmdline_mark)
    if child.poll() is None:
        child.signal(signal.SIGKILL, group=False)
    child.wait()
    return swept
