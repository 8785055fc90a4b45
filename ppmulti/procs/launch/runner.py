"""A launch on this node: port preflight, ppmulti's node rendezvous, then Paddle's launcher under the supervisor.

Missing nodes. Paddle 2.6's HTTP master waits forever for a node that never joins, and under ``--ips``
the workers block 900 s in the TCP store. So before Paddle starts, ppmulti runs its own rendezvous
(``rendezvous.py``: only this run's nodes can join, within ``--rdzv-timeout``), whose endpoint is
``master_port`` in master mode; Paddle's HTTP rendezvous runs on ``master_port + 1`` (rank 0's TCP store is a
port Paddle picks: PADDLE_MASTER). After the handover the runner waits at most ``--rdzv-timeout`` more for
this node's first rank to start (``worker.py`` touches a ready file) and stops Paddle's launcher otherwise,
which covers a node dying between the two rendezvous.

Ports. A port the user named (``--master_port``, ``--start_port``, ``FLAGS_START_PORT``) that is taken
here is a UserError naming the port and the flag that changes it, raised before anything starts. On a
single node Paddle picks every port itself (a named ``--master_port`` is still checked), so nothing is
picked here; the ports of a multi-node launch are fixed by the flags because the other nodes must know
them in advance (``--master_port`` defaults to 29500, ``--start_port`` to 6070).

Signals. Paddle's launcher runs in its own process group and each of its workers in its own session;
SIGINT/SIGTERM to ppmulti are forwarded to the launcher's group (Paddle then stops its workers), and
``worker.py`` asks Linux to kill each rank if the launcher itself dies (PR_SET_PDEATHSIG). Starting, forwarding
and stopping go through ``ppmulti.procs.supervisor``.

Interrupts. The launcher notes the signal it got (``rundir.SIGNALLED``: Paddle's launcher stops every rank with
SIGTERM, so a Ctrl-C is named SIGINT only from there). After the ranks have stopped, the launcher says what rank 0
saved (``rundir.INTERRUPTED`` in the launch directory, written by the ranks' stop-on-signal hook) and the command
that resumes, in the user's own dialect, and exits with 128 + the signal it received, as a single process would; or,
when rank 0 had finished the run before the signal (its done mark and no record), says so and exits 0.

Log directory. Paddle's launcher writes into ``log`` unless ``--log_dir`` says otherwise; a *file* named ``log``
(``ppmulti launch ... > log`` makes one before ppmulti starts) would stop it, so the logs then go to
``ppmulti-log`` with a line saying so. A ``--log_dir`` that is a file is refused by name. A launch holds its log
directory with an flock (``LOG_DIR/.ppmulti-launch.lock``); a second launch started while the first runs, from the
same directory or with the same ``--log_dir``, writes ``LOG_DIR/launch2/`` (``launch3`` ...) and says so, so that
neither console shows the other's lines (Paddle's launcher echoes ``LOG_DIR/workerlog.0``).

Restarts and the hint. After a failure the launcher suggests ``--max_restarts N`` only where a restart could get
past it (``restart_could_help``): not after a Python error that came before the first training step ended, which a
restart meets again; with ``--max_restarts`` such an error seen twice in a row ends the restarts.

States and result. A ``result.Launch`` holds where the launch is (``LaunchState``: INIT, RENDEZVOUS, RUNNING,
RESTARTING, then SUCCEEDED, FAILED, HUNG, REFUSED or INTERRUPTED), the signal forwarded and the last start's rank
exits; ``run`` returns the frozen ``RunResult`` and writes it to ``LOG_DIR/result.json`` however the launch ends
(a UserError too; not ``--dry-run``), for schedulers and CI. The exit code is the one the launch always had. The
nodes meet through one ``rendezvous.Rendezvous``: ``NodeRendezvous`` for a fixed ``--nnodes``, etcd's for
``--nnodes MIN:MAX`` (elastic.py).

Output. The launcher's stdout and stderr come through ``console.LauncherOutput``: Paddle's chatter is kept in
``LOG_DIR/launcher.log`` and off the console (``--verbose`` shows it), environment values are hidden, and the
environment dumps Paddle leaves in LOG_DIR are scrubbed after every attempt.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import shutil
import signal
import socket
import sys
import re
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import IO, Mapping, TextIO

from ppmulti.common import envvars as E
from ppmulti.common import heartbeat as heartbeat_record
from ppmulti.common import shm
from ppmulti.common.compat import collective_timeout_env, launcher_spec
from ppmulti.common.errors import UserError
from ppmulti.common.procfs import alive, exit_code
from ppmulti.common.rundir import (INTERRUPTED, RUN_DIR_MARKER, SIGNALLED, STATE, blocking_file, resume_command,
                                   unwritable)
from ppmulti.procs import supervisor
from ppmulti.procs.launch.console import LauncherOutput, verbose_from
from ppmulti.procs.launch.flags import describe, launch_env, to_paddle
from ppmulti.procs.launch import netcheck
from ppmulti.procs.launch.netcheck import ifname_env, route_interface
from ppmulti.procs.launch.plan import LaunchPlan
from ppmulti.procs.launch.rendezvous import NodeRendezvous, Rendezvous, RendezvousError  # noqa: F401
from ppmulti.procs.launch.result import (RESULT_FILE, Launch, LaunchState, RankExit, RunResult, final_state,
                                        signal_name)
from ppmulti.procs.launch.watchdog import Watchdog, lost_a_peer

def _log(msg: str, out: TextIO | None = None) -> None:
    print(f"ppmulti launch: {msg}", file=out or sys.stderr, flush=True)


# --- what this machine has (no paddle import) ------------------------------------------------------
def local_addresses() -> set[str]:
    """IPv4 addresses of this machine: the host name's and each network interface's."""
    addrs = {"127.0.0.1"}
    try:
        addrs.update(socket.gethostbyname_ex(socket.gethostname())[2])
    except OSError:
        pass
    try:
        import fcntl
        import struct

        siocgifaddr = 0x8915
        for _, name in socket.if_nameindex():
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                try:
                    packed = fcntl.ioctl(s.fileno(), siocgifaddr, struct.pack("256s", name[:15].encode()))
                    addrs.add(socket.inet_ntoa(packed[20:24]))
                except OSError:
                    continue
    except (ImportError, OSError):
        pass
    return addrs


def visible_gpu_count(environ: Mapping[str, str]) -> int | None:
    """GPUs the installed Paddle can use: 0 for a CPU build, else from CUDA_VISIBLE_DEVICES or the driver;
    None when it cannot be told without importing paddle."""
    from importlib import metadata

    try:
        metadata.distribution("paddlepaddle-gpu")
    except metadata.PackageNotFoundError:
        return 0
    visible = environ.get(E.CUDA_VISIBLE_DEVICES)
    if visible is not None and visible.strip() != "all":
        return len([x for x in visible.split(",") if x.strip() and x.strip() != "-1"])
    try:
        return len(os.listdir("/proc/driver/nvidia/gpus"))
    except OSError:
        return None


# --- ports ---------------------------------------------------------------------------------------------
def _listen(port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    # like Paddle's KV server and TCP store: a port left in TIME_WAIT by an earlier run is usable
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(("", port))  # wildcard: conflicts with a socket on any address of this machine
        sock.listen(64)
    except OSError:
        sock.close()
        raise
    return sock


def _port_taken(port: int, flag: str, why: str) -> UserError:
    return UserError(f"port {port} ({why}) is already in use on this machine; choose another with {flag}")


def _check_free(port: int, flag: str, why: str) -> None:
    try:
        _listen(port).close()
    except OSError as exc:
        if exc.errno in (errno.EADDRINUSE, errno.EACCES):
            raise _port_taken(port, flag, why) from None
        raise


def preflight(plan: LaunchPlan, out: TextIO | None = None,
              restart: bool = False) -> tuple[LaunchPlan, socket.socket | None]:
    """Check the ports this node will bind; return the plan with any port picked, and node 0's listener.

    ``restart``: the worker ports were checked before the first start; a node other than 0 skips them, because
    node 0, restarted first, may already hold the same port number for rank 0's store when both "nodes" are
    addresses of one machine (a loopback test), and nothing on the other nodes binds them."""
    master_flag = plan.master_port_flag or "--master_port"
    start_flag = plan.start_port_flag or "--start_port"
    if plan.mode == "single":
        # Paddle 2.6 picks rank 0's store port itself on one node; a port the user named must still be free,
        # as torchrun would insist
        if plan.master_port is not None:
            _check_free(plan.master_port, master_flag, f"given by {master_flag}")
        return plan, None
    if plan.mode == "ips" and not (restart and plan.node_rank != 0):
        for i in range(plan.nproc_per_node):
            _check_free(plan.start_port + i, start_flag, f"endpoint of local rank {i}, {start_flag} + {i}")
    listener = None
    if plan.node_rank == 0 and plan.rdzv_endpoint is not None:
        _, port = plan.rdzv_endpoint
        flag, why = ((master_flag, "ppmulti's rendezvous") if plan.mode == "master"
                     else (start_flag, f"ppmulti's rendezvous, {start_flag} - 1"))
        try:
            listener = _listen(port)
        except OSError as exc:
            if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                raise _port_taken(port, flag, why) from None
            raise
        if plan.mode == "master":
            try:
                _check_free(port + 1, master_flag, f"Paddle's rendezvous, {master_flag} + 1")
            except UserError:
                listener.close()
                raise
    return plan, listener


# --- the launcher process ------------------------------------------------------------------------------
def console_tty() -> str | None:
    """The terminal on this process's fd 1, or None. Paddle's launcher inherits fd 1 and copies rank 0's
    workerlog to it line by line (every ~2 s), so a bar's carriage-return redraws must not go that way."""
    try:
        return os.ttyname(1) if os.isatty(1) else None
    except OSError:
        return None


class _RankWatch:
    """Which rank of this node went first when a launch fails, and why.

    ``worker.py`` leaves ``rankN.started`` (its pid), then ``rankN.done`` or, on a Python exception or a
    non-zero exit, ``rankN.failed`` (the cause) in the launch directory. Paddle stops every other rank once
    one fails, so the first unfinished rank whose process vanished is the one that brought the launch
    down; one with no ``failed`` mark was killed by a signal (SIGKILL, the out-of-memory killer).
    """

    def __init__(self, directory: str):
        self.directory = directory
        self.first_gone: int | None = None
        self.statuses: dict[int, RankExit] = {}   # what Linux said of a rank seen as a zombie, before Paddle reaped it

    def _marks(self) -> list[str]:
        """The marks in the launch directory; none if it is gone (removed from outside while the ranks run:
        the launch goes on, it only loses the names of who failed first)."""
        try:
            return os.listdir(self.directory)
        except FileNotFoundError:
            return []

    def started(self) -> dict[int, int]:
        ranks = {}
        for name in self._marks():
            if name.startswith("rank") and name.endswith(".started"):
                try:
                    ranks[int(name[4:-8])] = int(open(os.path.join(self.directory, name)).read().strip())
                except (OSError, ValueError):
                    continue
        return ranks

    def poll(self) -> None:
        """Note each rank's exit status while Linux still holds it, and the first rank gone."""
        started = self.started()
        for rank, pid in started.items():
            if rank not in self.statuses:
                status = zombie_status(pid)
                if status is not None:
                    self.statuses[rank] = status
        self._first_gone(started)

    def _first_gone(self, started: dict[int, int]) -> None:
        """Note the first rank gone. Several can vanish between two polls (a rank killed by a signal takes its
        peers' collectives down within milliseconds): one that lost a peer (its Python error says so, or it
        aborted in gloo) is a victim, so any other rank gone with it is named first."""
        if self.first_gone is None:
            mark = os.path.join(self.directory, "rank{}.{}")
            gone = [r for r, pid in started.items()
                    if not alive(pid) and not os.path.exists(mark.format(r, "done"))
                    and not os.path.exists(mark.format(r, "stopped"))]
            if gone:
                failed = self.failed()
                self.first_gone = min(gone, key=lambda r: (
                    lost_a_peer(failed.get(r, ""), heartbeat_record.fatal(self.directory, r)), r))

    def failed(self) -> dict[int, str]:
        """The cause each ``rankN.failed`` mark gives, by rank."""
        failed = {}
        for name in self._marks():
            if name.startswith("rank") and name.endswith(".failed"):
                try:
                    failed[int(name[4:-7])] = open(os.path.join(self.directory, name)).read().strip()
                except (OSError, ValueError):
                    continue
        return failed

    def exits(self) -> dict[int, RankExit]:
        """Each started rank's exit code or signal name: what Linux said, else what the rank's marks say (a rank
        gone with no mark and no fatal-signal report was killed by SIGKILL, the one signal that leaves neither)."""
        exits: dict[int, RankExit] = {}
        for rank, pid in self.started().items():
            if rank in self.statuses:
                exits[rank] = self.statuses[rank]
            elif not alive(pid):
                exits[rank] = self._exit_from_marks(rank)
        return exits

    def _exit_from_marks(self, rank: int) -> RankExit:
        mark = os.path.join(self.directory, f"rank{rank}.{{}}")
        if os.path.exists(mark.format("done")):
            return 0
        if os.path.exists(mark.format("stopped")):
            return "SIGTERM"
        text = self.failed().get(rank)
        if text is not None:
            code = text[len("exited with code "):] if text.startswith("exited with code ") else ""
            return int(code) if code.lstrip("-").isdigit() else 1   # a Python error (or exit("text")) exits 1
        fatal = heartbeat_record.fatal(self.directory, rank) or ""
        named = re.search(r"\b(SIG[A-Z]+)\b", fatal) or re.search(r"\b(Aborted|Segmentation fault)", fatal)
        return {"Aborted": "SIGABRT", "Segmentation fault": "SIGSEGV"}.get(named[1], named[1]) if named else "SIGKILL"

    def cause(self) -> str:
        failed = self.failed()
        rank = self.first_gone
        if rank is not None and rank in failed:
            return f"rank {rank} failed: {failed[rank]}"
        fatal = heartbeat_record.fatal(self.directory, rank) if rank is not None else None
        if rank is not None and fatal:
            return f"rank {rank} died of a fatal signal ({fatal}; see its workerlog)"
        if rank is not None:
            return f"rank {rank} died without a Python error (killed by a signal: SIGKILL, the out-of-memory killer)"
        if failed:
            rank = min(failed)
            return f"rank {rank} failed: {failed[rank]}"
        return "the launcher failed before any rank started"

    def reset(self) -> None:
        self.statuses = {}
        for name in self._marks():
            if name.startswith("rank"):
                try:
                    os.unlink(os.path.join(self.directory, name))
                except OSError:
                    pass
        self.first_gone = None


def zombie_status(pid: int) -> RankExit | None:
    """A dead, not yet reaped process's exit code, or the name of the signal that killed it (``/proc/PID/stat``
    field 52, Linux 3.5+); None while it runs or once gone. The ranks are Paddle's launcher's children, which
    reaps them within a second: polled every 0.1 s, the runner sees most of them."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    if fields[0] != "Z" or len(fields) < 50:
        return None
    status = int(fields[49])
    return signal_name(status & 0x7F) if status & 0x7F else status >> 8


# --- where Paddle's logs go ------------------------------------------------------------------------------
ALT_LOG_DIR = "ppmulti-log"   # when ./log is a file


def choose_log_dir(given: str | None, default: str) -> tuple[str | None, str | None]:
    """(the log directory to pass to Paddle's launcher, a line to say about it): ``given`` (``--log_dir``) as it
    is unless it is, or lies under, a file (a UserError naming both); else Paddle's own ``default`` (None: nothing
    to pass) unless a file stands there, then ``ALT_LOG_DIR`` and a line saying why."""
    if given:
        blocker = blocking_file(given)
        if blocker is not None:
            raise UserError(f"--log_dir {given}: {blocker} is a file, not a directory; pass another --log_dir DIR")
        place, why = unwritable(given)
        if place is not None:
            raise UserError(f"--log_dir {given}: cannot write in {place} ({why}); pass another --log_dir DIR")
        return given, None
    blocker = blocking_file(default)
    if blocker is None:
        place, why = unwritable(default)
        if place is not None:
            shown = f"the working directory {os.getcwd()}" if place == Path(".") else str(place)
            raise UserError(f"cannot write in {shown} ({why}), where Paddle's launcher keeps its logs ({default}/): "
                            f"pass --log_dir DIR, or start from a directory you can write")
        return None, None
    if blocking_file(ALT_LOG_DIR) is not None:
        raise UserError(f"{blocker} and {ALT_LOG_DIR} are files, where Paddle's launcher keeps its logs: "
                        f"pass --log_dir DIR")
    return ALT_LOG_DIR, (f"{blocker} is a file, so Paddle's logs go to {ALT_LOG_DIR}/ instead "
                         f"(--log_dir DIR picks another place)")


LOG_LOCK = ".ppmulti-launch.lock"   # in a log directory: held (flock) by the launch writing there


def claim_log_dir(log_dir: str) -> tuple[str, IO | None, str | None]:
    """(the log directory this launch writes, the open lock file that holds it, a line to say): ``log_dir`` when no
    other running launch holds it, else its first free ``launchN`` subdirectory. Paddle's launcher shows the console
    what it reads back from ``LOG_DIR/workerlog.0``; two launches started from one directory would each show the
    other's lines, errors and result. The lock is an flock, so a launch that died frees it. A directory that cannot
    be written is left as it is (the launch says so where it writes)."""
    for n in range(1, 100):
        where = log_dir if n == 1 else os.path.join(log_dir, f"launch{n}")
        try:
            os.makedirs(where, exist_ok=True)
            lock = open(os.path.join(where, LOG_LOCK), "a")
        except OSError:
            return log_dir, None, None
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            lock.close()
            continue
        note = None if n == 1 else (f"{log_dir}/ is in use by another running launch: this launch's logs go to "
                                    f"{where}/ (--log_dir DIR picks the place)")
        return where, lock, note
    return log_dir, None, None


# --- what a signal stopped ---------------------------------------------------------------------------------
def interruption_lines(signame: str, record: dict | None, run_dir: str | None, command: list[str] | None,
                       node_rank: int = 0, checkpoint_exists: bool = False, finished: bool = False) -> list[str]:
    """What the launcher says once a signal stopped the ranks: what rank 0 saved (``record``, from the launch
    directory) or the run's last checkpoint, and the command that resumes (``command`` + ``--resume RUN_DIR``);
    ``finished``: rank 0 had completed the run when the signal came (nothing to resume)."""
    if node_rank != 0:
        return [f"{signame}: this node's ranks stopped; node 0 says what was saved and how to resume"]
    if record is None and finished:
        where = f" ({run_dir})" if run_dir else ""
        return [f"{signame} came as the run ended: rank 0 had finished it{where}, nothing to resume"]
    if record is not None and record.get("checkpoint"):
        run_dir = record.get("run_dir") or run_dir
        lines = [f"{signame}: the ranks stopped {record.get('where')} and saved {record['checkpoint']}"]
    elif run_dir is not None and checkpoint_exists:
        last = os.path.join(run_dir, "weights", f"last{STATE}")
        lines = [f"{signame}: the ranks stopped before saving this epoch; {last} holds the last saved one"]
    elif run_dir is not None:
        return [f"{signame}: the ranks stopped before any checkpoint of {run_dir} was saved"]
    else:
        return [f"{signame}: the ranks stopped"]
    if command is not None:
        lines.append(f"resume with: {resume_command(list(command or []), run_dir)}")
    return lines


def _read_json(path: str) -> dict | None:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _report_interrupt(plan: LaunchPlan, launch_dir: str, signum: int, command: list[str] | None,
                      out: TextIO | None) -> int:
    """Say what was saved and how to resume; the exit code a shell gives a process stopped by ``signum``."""
    try:
        signame = signal.Signals(signum).name
    except ValueError:
        signame = f"signal {signum}"
    record = _read_json(os.path.join(launch_dir, INTERRUPTED))
    try:
        run_dir: str | None = open(os.path.join(launch_dir, RUN_DIR_MARKER)).read().strip() or None
    except OSError:
        run_dir = None
    last = run_dir is not None and os.path.isfile(os.path.join(run_dir, "weights", f"last{STATE}"))
    # rank 0 exited 0 (worker.py's done mark) and left no interruption record: the signal came after its last vote
    finished = record is None and os.path.exists(os.path.join(launch_dir, "rank0.done"))
    for line in interruption_lines(signame, record, _shown(run_dir), command, plan.node_rank, last, finished):
        _log(line, out)
    return 0 if finished and plan.node_rank == 0 else 128 + signum


MEMORY_ERRORS = ("memoryerror", "out of memory", "resourceexhausted", "cannot allocate memory")


def _without_rank(cause: str | None) -> str | None:
    """A failure's text without the rank numbers it names: the same error on every rank reads the same."""
    return None if cause is None else re.sub(r"\brank \d+", "rank", cause)


def restart_could_help(watch: "_RankWatch", launch_dir: str) -> bool:
    """Whether starting the ranks again could get past this failure: a rank killed by a signal (the out-of-memory
    killer), one that died of a fatal signal, lost a peer (gloo/NCCL connection errors) or ran out of memory, or a
    Python error after training steps had run (data, a file, the machine). Not a Python error of the rank that went
    first before its first step ended (a bad config, a model that cannot train on several ranks): it comes back the
    same on every start."""
    from ppmulti.procs.launch.watchdog import peer_error

    failed = watch.failed()
    rank = watch.first_gone if watch.first_gone is not None else (min(failed) if failed else None)
    if rank is None or rank not in failed:
        return True   # no Python error of the first rank: a signal, the launcher, a timeout
    text = failed[rank]
    if peer_error(text) or heartbeat_record.fatal(launch_dir, rank) or any(m in text.lower() for m in MEMORY_ERRORS):
        return True
    if not text.startswith("exited with code") or text == "exited with code 1":
        progress = heartbeat_record.read(launch_dir, rank)
        return progress is not None and progress.step > 0   # a step ended before it (global steps count from 0)
    return True


REFUSED = f"exited with code {UserError.exit_code}"   # worker.py's failed mark for a UserError's (or argparse's) exit


def refused_at_start(failed: Mapping[int, str]) -> bool:
    """Whether the ranks that failed all refused their input (exit code 2: a UserError's one line, or argparse's),
    as every rank does with a bad flag, key or data set before training starts."""
    return bool(failed) and all(cause == REFUSED for cause in failed.values())


def _drop_unstarted_run(launch_dir: str) -> None:
    """Remove the run directory this launch made (noted in the launch directory) when the ranks refused before
    writing anything but the start of their logs, so that the corrected command gets the same name (exp, not
    exp2)."""
    from ppmulti.common.rundir import unstarted

    try:
        run_dir = open(os.path.join(launch_dir, RUN_DIR_MARKER)).read().strip()
    except OSError:
        return
    if run_dir and unstarted(run_dir):
        shutil.rmtree(run_dir, ignore_errors=True)


def _shown(path: str | None) -> str | None:
    """A path as the user would type it from here: relative when under the working directory."""
    if path is None:
        return None
    rel = os.path.relpath(path)
    return path if rel.startswith("..") else rel


def run(plan: LaunchPlan, dry_run: bool = False, environ: Mapping[str, str] | None = None,
        out: TextIO | None = None, command: list[str] | None = None) -> RunResult:
    """Execute a plan on this node; return how it ended, also written to ``LOG_DIR/result.json`` (``--dry-run``:
    print the plan, run nothing, write nothing).

    Restarts (``--max_restarts N``): Paddle 2.6 restarts workers only under an etcd master, so ppmulti does
    it here. When the launch fails (a rank raised, was killed, ran out of memory), every rank is stopped
    by Paddle, and the whole launch starts again with PPMULTI_RESTART=k; a training started by ppmulti
    then resumes from its last checkpoint by itself (``ppmulti.rank.engine.trainer``). Interrupts are never
    restarted. After N restarts the launch fails naming the rank and the cause.
    """
    environ = dict(os.environ if environ is None else environ)
    log_dir, note = choose_log_dir(plan.log_dir, launcher_spec().default_log_dir)
    if note:
        _log(note, out)
        plan = replace(plan, log_dir=log_dir)
    if dry_run:
        (out or sys.stdout).write(describe(plan, environ))
        return RunResult(LaunchState.SUCCEEDED, 0)
    claimed, lock, note = claim_log_dir(plan.log_dir or launcher_spec().default_log_dir)
    if note:
        _log(note, out)
        plan = replace(plan, log_dir=claimed)
    try:
        return _run_claimed(plan, environ, out, command)
    finally:
        if lock is not None:
            lock.close()


def _run_claimed(plan: LaunchPlan, environ: dict[str, str], out: TextIO | None,
                 command: list[str] | None) -> RunResult:
    """``run`` once the log directory is this launch's own: the starts of the ranks, then the result, kept
    beside the logs however the launch ended."""
    launch = Launch()
    log_dir = plan.log_dir or launcher_spec().default_log_dir
    launch_dir = tempfile.mkdtemp(prefix="ppmulti-launch-")
    try:
        code = _starts(plan, environ, out, command, launch, launch_dir)
    except UserError as exc:   # a port taken, a node missing: the command prints the line, the result keeps it
        state = LaunchState.REFUSED if exc.exit_code == UserError.exit_code else LaunchState.FAILED
        _keep(launch.end(state, exc.exit_code, str(exc)), log_dir, out)
        raise
    except KeyboardInterrupt:   # Ctrl-C before Paddle's launcher started (signals are forwarded only after)
        launch.interrupt(signal.SIGINT)
        _keep(launch.end(LaunchState.INTERRUPTED, 128 + signal.SIGINT, "SIGINT before any rank started"), log_dir,
              out)
        raise
    finally:
        shutil.rmtree(launch_dir, ignore_errors=True)
    result = launch.end(final_state(code, launch), code)
    _keep(result, log_dir, out)
    return result


def _keep(result: RunResult, log_dir: str, out: TextIO | None) -> None:
    try:
        result.write(log_dir)
    except OSError as exc:
        _log(f"could not write {os.path.join(log_dir, RESULT_FILE)}: {exc.strerror or exc}", out)


def _starts(plan: LaunchPlan, environ: dict[str, str], out: TextIO | None, command: list[str] | None,
            launch: Launch, launch_dir: str) -> int:
    """Start the ranks until they end well, an interrupt, or ``--max_restarts`` is used up; the exit code."""
    if plan.elastic is not None:   # --nnodes MIN:MAX on etcd: rounds agreed there, each one start (elastic.py)
        from ppmulti.procs.launch.elastic import run_elastic

        return run_elastic(plan, environ, out, attempt_once, launch, launch_dir)
    rdzv = NodeRendezvous(environ)
    try:
        return _fixed_starts(plan, rdzv, environ, out, command, launch, launch_dir)
    finally:
        rdzv.close()


def _fixed_starts(plan: LaunchPlan, rdzv: Rendezvous, environ: dict[str, str], out: TextIO | None,
                  command: list[str] | None, launch: Launch, launch_dir: str) -> int:
    """The same world on every start, restarted whole under ``--max_restarts`` where a restart could help."""
    watch = _RankWatch(launch_dir)
    restarts = plan.max_restarts or 0
    last_cause: str | None = None
    while True:
        launch.to(LaunchState.RENDEZVOUS if plan.rdzv_endpoint is not None else LaunchState.RUNNING)
        agreed = rdzv.next_round(plan, out)
        rc = _attempt(agreed.plan, environ, out, launch_dir, agreed.number, watch, launch, rdzv)
        rdzv.round_ended(rc == 0)
        if launch.interrupted:
            return _report_interrupt(plan, launch_dir, launch.signum or 0, command, out)
        if rc == 0:
            return rc
        if refused_at_start(watch.failed()):   # each rank said why in one line: nothing to add or restart
            launch.refused = True
            if plan.node_rank == 0:
                _drop_unstarted_run(launch_dir)
                launch.run_dir = None
            return UserError.exit_code
        cause = launch.cause or ""
        helps = restart_could_help(watch, launch_dir)
        same = _without_rank(cause) == _without_rank(last_cause)   # every rank fails alike; which is first varies
        if launch.restarts < restarts and not (same and not helps):
            _log(f"{cause}; restarting every rank ({launch.restarts + 1} of {restarts} restarts), "
                 f"training resumes from its last checkpoint", out)
            last_cause = cause
            launch.restart()
            continue
        _give_up(cause, rc, launch.restarts, restarts, same and not helps, helps, out)
        return rc


def _give_up(cause: str, rc: int, used: int, restarts: int, hopeless: bool, helps: bool, out: TextIO | None) -> None:
    """The last line of a failed launch: why, and whether --max_restarts could help."""
    if hopeless:
        _log(f"giving up after {used} restart(s): {cause}; the same error as the last attempt, before any "
             f"training step ended (a restart cannot fix it)", out)
    elif restarts:
        _log(f"giving up after {restarts} restart(s): {cause}", out)
    elif helps:
        _log(f"{cause} (exit code {rc}); pass --max_restarts N to restart automatically", out)
    else:
        _log(f"{cause} (exit code {rc})", out)


def _attempt(plan: LaunchPlan, environ: dict[str, str], out: TextIO | None, launch_dir: str, number: int,
             watch: "_RankWatch", launch: Launch, rdzv: Rendezvous) -> int:
    """One start of this node's ranks; afterwards ``launch`` holds their exits, the run directory and, when it
    failed, its cause."""
    watch.reset()
    dog = Watchdog(launch_dir, plan.hang_timeout, plan.node_rank, plan.nnodes, local_world=plan.nnodes == 1,
                   log_dir=plan.log_dir)
    try:
        rc = _run_once(plan, environ, out, launch_dir, number, watch, launch, dog, rdzv)
    finally:
        _sweep_ranks(launch_dir, dog, out)
    launch.ranks = watch.exits()
    launch.run_dir = _run_dir_of(launch_dir) or launch.run_dir
    launch.hung = dog.fired is not None
    if rc != 0:   # as the console says it; the result prefers the rendezvous's reason (Launch.end)
        launch.cause = dog.explain_exit(watch.first_gone, watch.failed()) or watch.cause()
    if launch.interrupted:
        launch.cause = f"the launcher received {signal_name(launch.signum or 0)} and stopped the ranks"
    return rc


def _run_dir_of(launch_dir: str) -> str | None:
    """The run directory the ranks noted in the launch directory (rundir.RUN_DIR_MARKER), absolute."""
    try:
        run_dir = open(os.path.join(launch_dir, RUN_DIR_MARKER)).read().strip()
    except OSError:
        return None
    return os.path.abspath(run_dir) if run_dir else None


def attempt_once(plan: LaunchPlan, environ: dict[str, str], out: TextIO | None, launch_dir: str, attempt: int,
                 launch: Launch, rdzv: Rendezvous) -> int:
    """One start of an elastic round: ``rdzv.lost()`` (polled while it runs) ends it early with its reason;
    an interrupt says what was saved and returns 128 + the signal."""
    watch = _RankWatch(launch_dir)
    rc = _attempt(plan, environ, out, launch_dir, attempt, watch, launch, rdzv)
    if launch.interrupted:   # an elastic job is started again by the same command on every node: no resume line
        return _report_interrupt(plan, launch_dir, launch.signum or 0, None, out)
    if rc != 0 and not launch.abort_reason:   # an abort has said why already
        _log(launch.cause or "", out)
    return rc


def _sweep_ranks(launch_dir: str, dog: Watchdog, out: TextIO | None) -> None:
    """After an attempt: no process of its ranks (data-loader workers included: they inherit the launch
    directory's variable) and none of their shared memory outlives it, however the ranks ended."""
    swept = supervisor.sweep(E.PPMULTI_LAUNCH_DIR, launch_dir)
    if swept.left:
        _log(f"{len(swept.left)} process(es) of the ranks could not be stopped: pid {swept.left}", out)
    # and the ranks' RAM cache (--cache ram) when one died while it was being built and mapped
    for path in dog.shared_memory_left() + shm.launch_leftovers(launch_dir):
        try:
            os.unlink(path)
        except OSError:
            pass


def _with_route_host(plan: LaunchPlan, out: TextIO | None) -> LaunchPlan:
    """Master mode without --host: this node's address for Paddle's launcher is the one its route to node 0 leaves
    from (node 0: the master address itself). Left to itself Paddle takes the host name's address, which on a
    machine with several interfaces need not reach node 0; its HTTP master then never starts ("master not ready")."""
    if plan.mode != "master" or plan.host:
        return plan
    route = route_interface(str(plan.master_addr))
    if route is None or route.interface in (None, "lo"):   # one machine (loopback): Paddle's own pick works
        return plan
    host = str(plan.master_addr) if plan.node_rank == 0 else route.source
    why = "the master address" if plan.node_rank == 0 else "the address its route to node 0 leaves from"
    _log(f"node {plan.node_rank}: --host {host} for Paddle's launcher, {why}", out)
    return replace(plan, host=host)


def _socket_interface(plan: LaunchPlan, env: Mapping[str, str], out: TextIO | None) -> dict[str, str]:
    """gloo's and NCCL's interface on a multi-node launch: the one the route to node 0 uses (netcheck.py)."""
    if plan.rdzv_endpoint is None:
        return {}
    route = route_interface(plan.rdzv_endpoint[0])
    if route is None or route.interface in (None, "lo"):   # one machine (loopback): nothing to choose
        return {}
    chosen = ifname_env(route, env)
    if chosen:
        where = "holds the master address" if plan.node_rank == 0 else "carries the route to node 0"
        _log(f"node {plan.node_rank}: gloo and NCCL use {route.interface} ({route.source}), which {where} "
             f"({' and '.join(sorted(chosen))})", out)
    return chosen


def _report_allreduce(plan: LaunchPlan, directory: str, links: list, rc: int, out: TextIO | None) -> None:
    """--check-network: node 0 reports the all-reduce's figures with the links' (netcheck.py)."""
    result = netcheck.read_timings(directory)
    if rc == 0 and result and plan.node_rank == 0:
        for line in netcheck.allreduce_report(result, "NCCL" if plan.device == "gpu" else "gloo", links):
            _log(line, out)
    elif rc == 0 and result:
        _log(f"node {plan.node_rank}: network check done (node 0 reports the figures)", out)


def _run_once(plan: LaunchPlan, environ: dict[str, str], out: TextIO | None, launch_dir: str, attempt: int,
              watch: _RankWatch, launch: Launch, dog: Watchdog, rdzv: Rendezvous) -> int:
    plan, listener = preflight(plan, out, restart=attempt > 0)
    links = rdzv.meet(plan, listener, out)
    launch.to(LaunchState.RUNNING)
    if plan.check_network:   # the ranks all-reduce instead of training, then node 0 reports (netcheck.py)
        plan = netcheck.allreduce_plan(plan, os.path.join(launch_dir, "netcheck"))
        _log(f"node {plan.node_rank}: network check: every rank all-reduces {plan.network_check_mb:g} MB "
             f"({'NCCL' if plan.device == 'gpu' else 'gloo'}); --check-network starts no training", out)
    plan = _with_route_host(plan, out)
    argv, _ = to_paddle(plan)
    child_env, _, _ = launch_env(plan, environ)
    child_env.update(_socket_interface(plan, child_env, out))
    ready = os.path.join(launch_dir, "started")
    child_env[E.PPMULTI_READY_FILE] = ready
    child_env[E.PPMULTI_LAUNCH_DIR] = launch_dir
    child_env[E.PPMULTI_RESTART] = str(attempt)
    child_env.update(collective_timeout_env(plan.device, plan.hang_timeout, child_env))
    tty = console_tty()
    if tty is not None:   # rank 0 draws its bars there (ppmulti.rank.engine.progress); absent: plain lines
        child_env[E.PPMULTI_CONSOLE_TTY] = tty
    # the launcher's output is filtered to the console and kept in LOG_DIR/launcher.log (console.py)
    output = LauncherOutput(plan.log_dir, environ, verbose_from(plan.verbose, environ))
    child_env = output.child_env(child_env)
    # its own process group, so that one signal reaches the launcher and nothing else of ours
    child = supervisor.start(argv, env=child_env, stdout=supervisor.PIPE, stderr=supervisor.PIPE)
    output.follow(child.stdout, child.stderr)

    def forward(signum: int) -> None:
        if launch.interrupt(signum):   # the ranks name this signal, not the SIGTERM Paddle's launcher stops them with
            try:
                with open(os.path.join(launch_dir, SIGNALLED), "w") as f:
                    f.write(signal.Signals(signum).name + "\n")
            except (OSError, ValueError):
                pass
        child.signal(signum)

    try:
        with supervisor.forward_signals(forward):
            deadline = time.monotonic() + plan.rdzv_timeout if plan.nnodes > 1 else None
            while True:
                code = child.wait(0.1)   # short: see the first rank that dies
                if code is not None:
                    if plan.check_network:
                        _report_allreduce(plan, os.path.join(launch_dir, "netcheck"), links, exit_code(code), out)
                    return exit_code(code)
                watch.poll()
                reason = rdzv.lost()
                if reason:
                    launch.abort_reason = reason
                    _log(f"{reason}; stopping this node's ranks", out)
                    supervisor.sweep(E.PPMULTI_LAUNCH_DIR, launch_dir)
                    child.stop()
                    return 1
                if dog.poll(watch.started()):
                    # the stalled rank is named and every stack written: stop the ranks now, then the launcher
                    supervisor.sweep(E.PPMULTI_LAUNCH_DIR, launch_dir)
                    child.stop()
                    return 1
                if deadline is not None:
                    if os.path.exists(ready):
                        deadline = None
                    elif time.monotonic() > deadline:
                        _log(f"no rank started on node {plan.node_rank} within {plan.rdzv_timeout:g}s after all "
                             f"nodes joined: Paddle's own rendezvous is stuck (did a node stop?); stopping", out)
                        child.stop()
                        return 1
    finally:
        if child.poll() is None:
            child.stop()
        output.close()
        if os.path.exists(ready):
            os.unlink(ready)
