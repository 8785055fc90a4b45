"""Detached runs: `ppmulti launch/evolve --detach`, and `ppmulti ps`, `ppmulti logs`, `ppmulti stop`.

A detached run is the same ``ppmulti`` command started again under a small wrapper
(``python -m ppmulti.procs.runs.detach RECORD_DIR``) in a new session, stdin from /dev/null, output appended to a
log file, so it outlives the terminal. Each run has a record directory ``$PPMULTI_HOME/runs/<id>/``
(default ``~/.ppmulti``): ``run.json`` (id, wrapper pid/pgid/sid and its kernel start time, command, cwd,
start time, log path), ``run_dir`` (the training's run directory once known), ``exit.json`` (the exit code,
written by the wrapper when the command ends) and ``stop.json`` (written by ``ppmulti stop``).

Every process of the run carries ``PPMULTI_RUN_ID=<token>`` in its environment. Paddle's launcher puts
itself and every rank in new sessions, so the session id alone does not find them; ``ppmulti stop`` finds
them by that tag in ``/proc/*/environ`` (and by the wrapper's session), sends SIGTERM to the wrapper (which
forwards it: the ranks agree on a step, rank 0 checkpoints, all exit), waits, SIGKILLs what is left after
``--timeout`` and checks that nothing of the run remains.

A launched training's run directory is created by its rank 0, which records it in the launch directory
(``PPMULTI_LAUNCH_DIR/run_dir``, see ``ppmulti.common.rundir.RUN_DIR_MARKER``); the wrapper reads the launch
directory from its tagged descendants' environment and keeps the answer in ``run_dir``, and links the log
into that directory as ``detached.log``. An evolution's directory is known from its flags.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shlex
import signal
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ppmulti.common import envvars as E
from ppmulti.common import procfs as procs
from ppmulti.common.errors import UserError, exit_on_user_error
from ppmulti.common.rundir import RUN_DIR_MARKER
from ppmulti.procs import supervisor

RUNS = "runs"
STOP_TIMEOUT = 60.0
LOG_NAME = "output.log"
LINKED_LOG = "detached.log"


# ----------------------------------------------------------------------------- records
def home() -> Path:
    """Where detached runs are recorded: $PPMULTI_HOME, default ~/.ppmulti."""
    return Path(os.environ.get(E.PPMULTI_HOME) or Path.home() / ".ppmulti")


def _runs_dir() -> Path:
    return home() / RUNS


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _write_json(path: Path, data: dict) -> None:
    from ppmulti.common.atomic import atomic_write_text

    atomic_write_text(path, json.dumps(data, indent=1) + "\n")


@dataclass
class Run:
    """One detached run as recorded."""

    id: str
    record: Path
    info: dict

    @property
    def pid(self) -> int:
        return int(self.info["pid"])

    @property
    def log(self) -> Path:
        return Path(self.info.get("log") or self.record / LOG_NAME)

    @property
    def exit(self) -> dict | None:
        return _read_json(self.record / "exit.json")

    @property
    def stop_requested(self) -> bool:
        return (self.record / "stop.json").is_file()

    def alive(self) -> bool:
        started = procs.start_time(self.pid)   # None when gone (or never read): never "alive" by None == None
        return started is not None and started == self.info.get("pid_start")

    @property
    def run_dir(self) -> Path | None:
        if self.info.get("run_dir"):
            return Path(self.info["run_dir"])
        with contextlib.suppress(OSError):
            text = (self.record / "run_dir").read_text().strip()
            return Path(text) if text else None
        return None

    def state(self) -> str:
        done = self.exit
        if done is not None:
            if int(done.get("code", 1)) == 0:
                return "finished"
            return "stopped" if self.stop_requested else "failed"
        if self.alive():
            return "stopping" if self.stop_requested else "running"
        return "stopped" if self.stop_requested else "failed"   # the wrapper died without a word (kill -9, reboot)


def load(run_id: str) -> Run:
    """The recorded run ``run_id``; an unknown id is one clear line (exit 2)."""
    record = _runs_dir() / str(run_id)
    info = _read_json(record / "run.json") if str(run_id) and "/" not in str(run_id) else None
    if info is None:
        raise UserError(f"no run '{run_id}' (ppmulti ps lists them)")
    return Run(str(run_id), record, info)


def all_runs() -> list[Run]:
    root = _runs_dir()
    if not root.is_dir():
        return []
    runs = []
    for entry in root.iterdir():
        info = _read_json(entry / "run.json")
        if info is not None:
            runs.append(Run(entry.name, entry, info))
    return sorted(runs, key=lambda r: (not r.id.isdigit(), int(r.id) if r.id.isdigit() else 0, r.id))


def _new_record() -> tuple[str, Path]:
    """The next free id (1, 2, ...): mkdir is atomic, so two detaching commands never share one."""
    root = _runs_dir()
    root.mkdir(parents=True, exist_ok=True)
    n = max((int(p.name) for p in root.iterdir() if p.name.isdigit()), default=0) + 1
    while True:
        try:
            (root / str(n)).mkdir()
            return str(n), root / str(n)
        except FileExistsError:
            n += 1


# ----------------------------------------------------------------------------- starting
def start(kind: str, argv: list[str], run_dir: Path | None = None, log_path: Path | None = None,
          meta: dict | None = None) -> int:
    """Start ``ppmulti KIND ARGV`` detached; print its id and where its output goes; return 0 at once."""
    run_id, record = _new_record()
    token = uuid.uuid4().hex
    command = [sys.executable, "-m", "ppmulti.cli", kind, *argv]
    log = Path(log_path) if log_path else record / LOG_NAME
    log.parent.mkdir(parents=True, exist_ok=True)
    _write_json(record / "command.json", {"argv": command, "cwd": os.getcwd(), "kind": kind})
    env = dict(os.environ)
    env[E.PPMULTI_RUN_ID] = token
    env[E.PYTHONUNBUFFERED] = "1"   # `ppmulti logs -f` shows lines as they come
    with open(log, "ab") as out:
        proc = supervisor.start([sys.executable, "-m", "ppmulti.procs.runs.detach", str(record)],
                                stdin=supervisor.DEVNULL, stdout=out, stderr=supervisor.STDOUT, env=env)
    info = {"id": run_id, "token": token, "kind": kind, "pid": proc.pid, "pgid": proc.pid, "sid": proc.pid,
            "pid_start": procs.start_time(proc.pid), "command": "ppmulti " + shlex.join([kind, *argv]), "argv": command,
            "cwd": os.getcwd(), "started": time.time(), "log": str(log.resolve()),
            "run_dir": str(Path(run_dir).resolve()) if run_dir else None, **(meta or {})}
    _write_json(record / "run.json", info)
    print(f"started run {run_id} (pid {proc.pid}): {info['command']}")
    print(f"  output: {log}   follow: ppmulti logs {run_id} -f   stop: ppmulti stop {run_id}")
    return 0


# ----------------------------------------------------------------------------- the wrapper
def tagged(token: str, sid: int | None = None) -> list[int]:
    """Live processes of a run: those tagged with its token, and those in the wrapper's session."""
    return procs.tagged(E.PPMULTI_RUN_ID, token, sid)


def _discover_run_dir(token: str) -> str | None:
    """The training's run directory, as rank 0 recorded it in its launch directory."""
    for pid in procs.pids():
        env = procs.environ(pid)
        if not env or env.get(E.PPMULTI_RUN_ID) != token or not env.get(E.PPMULTI_LAUNCH_DIR):
            continue
        with contextlib.suppress(OSError):
            text = Path(env[E.PPMULTI_LAUNCH_DIR], RUN_DIR_MARKER).read_text().strip()
            if text:
                return text
    return None


def _run_dir_from_log(log: Path) -> str | None:
    """train_cli's last line is a JSON object with ``run_dir``; the fallback once the launch directory is gone."""
    with contextlib.suppress(OSError):
        for line in reversed(log.read_text(errors="replace").splitlines()[-50:]):
            if line.startswith("{") and '"run_dir"' in line:
                with contextlib.suppress(ValueError):
                    return json.loads(line).get("run_dir")
    return None


def _link_log(log: Path, run_dir: str) -> None:
    """The run's output also under its run directory: a hard link (same file), else a symbolic one."""
    target = Path(run_dir) / LINKED_LOG
    with contextlib.suppress(OSError):
        if target.exists() or target.is_symlink():
            target.unlink()
        try:
            os.link(log, target)
        except OSError:
            os.symlink(log, target)


def wrap(record: Path) -> int:
    """The detached run's session leader: run the command, forward stop signals, record the exit code."""
    command = _read_json(record / "command.json")
    if command is None:
        print(f"ppmulti detach: {record}/command.json is missing", file=sys.stderr)
        return 2
    token = os.environ.get(E.PPMULTI_RUN_ID, "")
    try:
        # in the wrapper's session, where `ppmulti stop` also looks; the wrapper passes stop signals on itself
        proc = supervisor.start(command["argv"], cwd=command["cwd"], stdin=supervisor.DEVNULL, new_session=False)
    except OSError as exc:
        print(f"ppmulti detach: cannot start {command['argv'][:4]} in {command['cwd']}: {exc}", file=sys.stderr)
        _write_json(record / "exit.json", {"code": 127, "ended": time.time()})
        return 127
    signal.signal(signal.SIGHUP, signal.SIG_IGN)   # no terminal, but a stray hangup must not end the run
    with supervisor.forward_signals([proc]):
        _watch(proc, record, token, command.get("kind") == "launch")
        code = proc.exit_code
        _write_json(record / "exit.json", {"code": code, "ended": time.time()})
    return code


def _watch(proc: supervisor.Child, record: Path, token: str, need_dir: bool) -> None:
    """Wait for the command to end; meanwhile, find and record a launch's run directory."""
    next_look = 0.0
    while proc.wait(0.5) is None:
        if need_dir and time.monotonic() >= next_look:
            next_look = time.monotonic() + 2.0
            try:
                found = _discover_run_dir(token)
                if found:
                    _record_run_dir(record, found)
                    need_dir = False
            except OSError as exc:   # never let bookkeeping end the run
                print(f"ppmulti detach: cannot record the run directory ({exc})", file=sys.stderr)
                need_dir = False
    if need_dir:
        info = _read_json(record / "run.json") or {}
        found = _run_dir_from_log(Path(info.get("log") or record / LOG_NAME))
        if found:
            _record_run_dir(record, found)


def _record_run_dir(record: Path, run_dir: str) -> None:
    from ppmulti.common.atomic import atomic_write_text

    atomic_write_text(record / "run_dir", run_dir + "\n")
    info = _read_json(record / "run.json") or {}
    _link_log(Path(info.get("log") or record / LOG_NAME), run_dir)


# ----------------------------------------------------------------------------- ps
def _total_epochs(run_dir: Path) -> int | None:
    import re

    with contextlib.suppress(OSError):
        m = re.search(r"^epoch:\s*(\d+)\s*$", (run_dir / "config.yml").read_text(), re.M)
        if m:
            return int(m.group(1))
    return None


def progress(run: Run) -> tuple[str, str]:
    """(epoch or generation, last metrics) of a run, from its results.csv / evolve.csv."""
    run_dir = run.run_dir
    if run_dir is None:
        return "-", "-"
    if run.info.get("kind") == "evolve":
        from ppmulti.procs.runs.evolve import EvolveStore, best

        store = EvolveStore(run_dir / "evolve.csv")
        try:
            rows = store.rows()
        except UserError:
            return "?", "evolve.csv unreadable"
        gens = run.info.get("generations")
        where = f"gen {len(rows)}/{gens}" if gens else f"gen {len(rows)}"
        top = best(store, rows)
        if top is None:
            return where, "-"
        m = top[0]
        return where, f"best fitness={m['fitness']:.4f} mAP50={m['mAP50']:.4f} mAP50-95={m['mAP50_95']:.4f}"
    from ppmulti.common.metrics import read_results

    try:
        cols = read_results(run_dir / "results.csv")
    except OSError:
        return "0", "-"
    except (ValueError, TypeError):   # not a results.csv ppmulti wrote (a non-number, a row too long)
        return "?", "results.csv unreadable"
    n = max(map(len, cols.values()), default=0)
    if n == 0:
        return "0", "-"
    total = _total_epochs(run_dir)
    epoch = (f"{cols['epoch'][-1]:.0f}" if "epoch" in cols else str(n)) + (f"/{total}" if total else "")
    shown = []
    validated = [i for i, v in enumerate(cols.get("mAP50", [])) if not math.isnan(v)]
    if validated:
        i = validated[-1]
        shown += [f"mAP50={cols['mAP50'][i]:.4f}", f"mAP50-95={cols['mAP50_95'][i]:.4f}"]
    if not math.isnan(cols.get("loss", [math.nan])[-1]):
        shown.append(f"loss={cols['loss'][-1]:.4f}")
    return epoch, " ".join(shown) or "-"


def describe(run: Run) -> dict[str, Any]:
    epoch, metrics = progress(run)
    done = run.exit
    return {"id": run.id, "state": run.state(), "exit_code": None if done is None else done.get("code"),
            "epoch": epoch, "metrics": metrics, "pid": run.pid,
            "started": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(run.info.get("started", 0))),
            "run_dir": str(run.run_dir) if run.run_dir else None, "log": str(run.log),
            "command": run.info.get("command", "")}


def cmd_ps(args: argparse.Namespace) -> int:
    rows = [describe(r) for r in all_runs()]
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    if not rows:
        print(f"no detached runs recorded under {home()}")
        return 0
    cols = ("id", "state", "epoch", "metrics", "started", "command")
    table = [[str(r[c]) + (f" ({r['exit_code']})" if c == "state" and r["state"] == "failed" else "")
              for c in cols] for r in rows]
    widths = [max(len(c), *(len(t[i]) for t in table)) for i, c in enumerate(cols)]
    print("  ".join(c.upper().ljust(w) for c, w in zip(cols, widths)).rstrip())
    for t in table:
        print("  ".join(v.ljust(w) for v, w in zip(t, widths)).rstrip())
    return 0


# ----------------------------------------------------------------------------- logs
def cmd_logs(args: argparse.Namespace) -> int:
    run = load(args.run)
    out = sys.stdout.buffer
    pos = 0
    try:
        while True:
            with contextlib.suppress(FileNotFoundError), open(run.log, "rb") as f:
                f.seek(pos)
                chunk = f.read()
                if chunk:
                    out.write(chunk)
                    out.flush()
                    pos += len(chunk)
            if not args.follow or (run.exit is not None or not run.alive()):
                if args.follow:   # one last read: the final lines written before the run ended
                    with contextlib.suppress(FileNotFoundError), open(run.log, "rb") as f:
                        f.seek(pos)
                        out.write(f.read())
                        out.flush()
                return 0
            time.sleep(0.3)
    except KeyboardInterrupt:
        return 0


# ----------------------------------------------------------------------------- stop
def stop(run: Run, timeout: float = STOP_TIMEOUT, out=None) -> int:
    """Stop a run gracefully (checkpoint first), then make sure none of its processes is left."""
    out = out or sys.stdout
    token, sid = run.info["token"], (run.pid if run.alive() else None)
    if run.exit is not None or (not run.alive() and not tagged(token)):
        print(f"run {run.id} is not running ({run.state()}); nothing to stop", file=out)
        return 0
    _write_json(run.record / "stop.json", {"requested": time.time(), "by": os.getpid()})
    if run.run_dir is None and run.info.get("kind") == "launch" and run.alive():
        # the wrapper looks for it every 2 s, which a loaded machine can delay: look now, while the ranks live
        found = _discover_run_dir(token)
        if found:
            _record_run_dir(run.record, found)
    print(f"stopping run {run.id}: SIGTERM, waiting up to {timeout:g}s for the checkpoint and exit", file=out,
          flush=True)
    # SIGTERM to the wrapper, which forwards it: the ranks agree on a step and save. With the wrapper gone but
    # something of the run not, SIGTERM to every process of the run.
    swept = supervisor.sweep(E.PPMULTI_RUN_ID, token, grace=timeout, sid=sid,
                             first=[run.pid] if run.alive() else None, poll=0.3)
    killed, left = swept.killed, swept.left
    if run.exit is None:   # the wrapper was killed before it could record the end
        _write_json(run.record / "exit.json", {"code": 128 + signal.SIGKILL, "ended": time.time(),
                                               "note": "killed by ppmulti stop"})
    if left:
        raise UserError(f"run {run.id}: processes {', '.join(map(str, left))} are still alive after SIGKILL")
    msg = f"run {run.id} stopped"
    if killed:
        msg += f" ({killed} process(es) killed after {timeout:g}s)"
    run_dir = run.run_dir
    if run_dir is not None and run.info.get("kind") == "launch":
        state = run_dir / "weights" / "last.pdstate"
        if state.is_file():
            msg += f"; checkpoint {state}, continue with --resume {run_dir}"
    elif run_dir is not None:
        msg += f"; the same ppmulti evolve command continues it ({run_dir})"
    print(msg, file=out)
    return 0


def cmd_stop(args: argparse.Namespace) -> int:
    if args.timeout <= 0:
        raise UserError(f"--timeout {args.timeout}: expected seconds > 0")
    return stop(load(args.run), args.timeout)


# ----------------------------------------------------------------------------- registration
def register(subparsers: Any) -> None:
    """Add ``ps``, ``logs`` and ``stop`` to the ``ppmulti`` subcommands."""
    ps = subparsers.add_parser("ps", help="list detached runs: id, state, epoch, last metrics, command",
                               description="Detached runs recorded under $PPMULTI_HOME (default ~/.ppmulti).")
    ps.add_argument("--json", action="store_true", help="one JSON object per run")
    ps.set_defaults(func=cmd_ps)
    logs = subparsers.add_parser("logs", help="print a detached run's output (-f: follow it)")
    logs.add_argument("run", help="run id (ppmulti ps)")
    logs.add_argument("-f", "--follow", action="store_true", help="keep printing until the run ends")
    logs.set_defaults(func=cmd_logs)
    st = subparsers.add_parser("stop", help="stop a detached run: checkpoint first, then every process of it")
    st.add_argument("run", help="run id (ppmulti ps)")
    st.add_argument("--timeout", type=float, default=STOP_TIMEOUT,
                    help=f"seconds to wait for the checkpoint before killing (default {STOP_TIMEOUT:g})")
    st.set_defaults(func=cmd_stop)


def main(argv: list[str] | None = None) -> int:
    """The wrapper's entry: ``python -m ppmulti.procs.runs.detach RECORD_DIR``."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        print("usage: python -m ppmulti.procs.runs.detach RECORD_DIR  (started by ppmulti launch/evolve --detach)",
              file=sys.stderr)
        return 2
    return exit_on_user_error(wrap, Path(args[0]))


if __name__ == "__main__":
    sys.exit(main())
