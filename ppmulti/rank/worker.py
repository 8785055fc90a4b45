"""Runs as each rank's entry point: adds torchrun's variables to Paddle's, then runs the script as __main__.

Paddle's launcher starts ``python -u .../ppmulti/rank/worker.py SCRIPT ARGS...`` (it runs a training
script with ``python -u`` only when its name ends in ``.py``), so ``sys.argv`` here is
``[worker.py, SCRIPT, ARGS...]`` with every argument, ``--`` included, exactly as the user typed it.
No paddle import: the script decides when paddle loads.
"""

from __future__ import annotations

import os
import runpy
import signal
import sys
from pathlib import Path


def _env_module():
    try:
        from ppmulti.common import envvars as env
    except ImportError:
        # run by file path from a checkout that is not installed: import ppmulti from the checkout;
        # later `import ppmulti.x` in the script keeps working through the package's own __path__
        root = str(Path(__file__).resolve().parents[2])
        sys.path.insert(0, root)
        try:
            from ppmulti.common import envvars as env
        finally:
            sys.path.remove(root)
    return env


def _die_with_launcher() -> None:
    """Paddle starts each worker in its own session, so a launcher killed with SIGKILL would orphan it."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)
    except (OSError, AttributeError):
        return
    if os.getppid() == 1:  # the launcher was already gone before prctl took effect
        os._exit(1)


def _trim_backup_env(env) -> None:
    """Paddle's launcher leaves this worker's whole environment in LOG_DIR/backup_env.N.json: keep only the
    variables Paddle left out of the environment itself (common/secrets.py)."""
    path = os.environ.get(env.PADDLE_BACKUP_ENV_PATH)
    if path:
        from ppmulti.common.secrets import trim_backup_env

        trim_backup_env(path, os.environ)


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args:
        print("usage: python -m ppmulti.rank.worker SCRIPT.py [ARGS ...]  (started by ppmulti launch)",
              file=sys.stderr)
        sys.exit(2)
    env = _env_module()
    # run by path: prepare for paddle before the script imports it (importing the seam runs ppmulti/rank/__init__.py,
    # which does the same; the call says it here)
    from ppmulti.rank.compat import before_paddle_import

    before_paddle_import()
    _die_with_launcher()
    _trim_backup_env(env)
    os.environ.update(env.torch_worker_env())
    ready = os.environ.get(env.PPMULTI_READY_FILE)
    if ready:
        try:
            Path(ready).touch()
        except OSError:
            pass
    from ppmulti.rank import heartbeat

    heartbeat.install()   # before the started mark: the watchdog finds the record of every rank it sees
    marks = _Marks(os.environ.get(env.PPMULTI_LAUNCH_DIR), env.worker_info().rank)
    marks.write("started", str(os.getpid()))
    marks.on_sigterm()
    script = args[0]
    # the same sys.argv and sys.path[0] that `python SCRIPT ARGS` would give the script
    sys.argv = [script, *args[1:]]
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as exc:
        marks.write("done" if exc.code in (None, 0) else "failed", f"exited with code {exc.code}")
        raise
    except BaseException as exc:
        from ppmulti.common.secrets import Redactor

        text = Redactor().line(str(exc)).strip().splitlines()   # the runner prints it: no env value in it
        marks.write("failed", f"{type(exc).__name__}: {text[0][:300] if text else ''}".rstrip(": "))
        raise
    heartbeat.beat("done")
    marks.write("done", "exited with code 0")


class _Marks:
    """``rankN.started`` (its pid), then ``rankN.done``, ``rankN.failed`` (the cause) or ``rankN.stopped``
    (SIGTERM) in the launch directory, for the runner to name the rank that brought a launch down. A rank
    killed by SIGKILL leaves no mark."""

    def __init__(self, directory: str | None, rank: int):
        self.directory, self.rank = directory, rank

    def on_sigterm(self) -> None:
        """Mark a rank that Paddle stops (SIGTERM) because another one failed, then die of the signal as before."""
        def stopped(signum, _frame):
            self.write("stopped", "stopped by SIGTERM")
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)

        signal.signal(signal.SIGTERM, stopped)

    def write(self, kind: str, text: str) -> None:
        if not self.directory:
            return
        try:
            Path(self.directory, f"rank{self.rank}.{kind}").write_text(text + "\n")
        except OSError:
            pass


if __name__ == "__main__":
    main()
