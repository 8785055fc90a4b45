"""Runs as each rank's entry point: adds torchrun's variables to Paddle's, then runs the script as __main__.

Paddle's launcher starts ``python -u .../ppmulti/launch/worker.py SCRIPT ARGS...`` (it runs a training
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
        from ppmulti import env
    except ImportError:
        # run by file path from a checkout that is not installed: import ppmulti from the checkout;
        # later `import ppmulti.x` in the script keeps working through the package's own __path__
        root = str(Path(__file__).resolve().parents[2])
        sys.path.insert(0, root)
        try:
            from ppmulti import env
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


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args:
        print("usage: python -m ppmulti.launch.worker SCRIPT.py [ARGS ...]  (started by ppmulti launch)",
              file=sys.stderr)
        sys.exit(2)
    env = _env_module()
    _die_with_launcher()
    os.environ.update(env.torch_worker_env())
    ready = os.environ.get(env.PPMULTI_READY_FILE)
    if ready:
        try:
            Path(ready).touch()
        except OSError:
            pass
    script = args[0]
    # the same sys.argv and sys.path[0] that `python SCRIPT ARGS` would give the script
    sys.argv = [script, *args[1:]]
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
