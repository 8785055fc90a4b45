"""Run directories: naming (base/name, then name2, name3, ... as YOLOv5 does), a file in their way, the newest one,
the restart and interruption markers, and the command that resumes a run."""

from __future__ import annotations

import contextlib
import os
import shlex
import tempfile
from pathlib import Path

from ppmulti.common.errors import UserError

WEIGHTS = ".pdparams"   # model weights (EMA applied when EMA is on): what eval/infer/export load
STATE = ".pdstate"      # everything resume needs
RUN_DIR_MARKER = "run_dir"   # in a launch's directory: the run that a restarted launch continues
INTERRUPTED = "interrupted.json"   # in a launch's directory: what rank 0 saved when a signal stopped the run
SIGNALLED = "signal"   # in a launch's directory: the signal the launcher got (its ranks all see SIGTERM from Paddle)


def blocking_file(path: Path | str) -> Path | None:
    """The file (not a directory) that stops ``path`` from being a directory: ``path`` itself or the nearest
    existing of its parents, when that is not a directory; None when nothing is in the way."""
    for p in (Path(path), *Path(path).parents):
        if p.is_dir():
            return None
        if p.exists() or p.is_symlink():
            return p
    return None


def check_run_place(base: Path | str, name: str, exist_ok: bool = False, where: str = "--project DIR") -> None:
    """A UserError in one line when a file stands where the run directory ``base/name`` would be made (a file named
    ``runs`` or ``output`` in the working directory), or when the directory it would be made in cannot be written;
    ``where`` names the flag that picks another place."""
    target = Path(base) / name
    blocker = blocking_file(target if exist_ok else base)
    if blocker is not None:
        raise UserError(f"{blocker} is a file, so the run directory {target} cannot be made there: move or rename "
                        f"the file, or pick another place with {where}")
    place, why = unwritable(target)
    if place is not None:
        shown = f"the working directory {os.getcwd()}" if place == Path(".") else str(place)
        raise UserError(f"cannot write in {shown} ({why}), so the run directory {target} cannot be made there: "
                        f"pick a writable place with {where}")


def nearest_dir(path: Path | str) -> Path:
    """``path`` itself or its nearest existing parent (``.`` for a relative path none of whose parts exist)."""
    for p in (Path(path), *Path(path).parents):
        if p.is_dir():
            return p
    return Path(".")


def unwritable(path: Path | str) -> tuple[Path | None, str]:
    """(the directory where ``path`` would be made or written, why it cannot be written) or (None, "").

    A real write is tried (a directory made and removed at once): ``os.access`` says yes to root on a read-only
    mount or an immutable (``chattr +i``) directory, where the run would then die with a PermissionError."""
    place = nearest_dir(path)
    try:
        probe = tempfile.mkdtemp(prefix=".ppmulti-write-test-", dir=place)
    except OSError as exc:
        return place, exc.strerror or type(exc).__name__
    with contextlib.suppress(OSError):
        os.rmdir(probe)
    return None, ""


def new_run_dir(base: Path | str, name: str, exist_ok: bool = False, where: str = "--project DIR") -> Path:
    """Create and return a fresh run directory ``base/name``, else the first free of ``name2``, ``name3``, ...
    (YOLOv5's increment_path: the lowest free number, so a deleted ``exp2`` is taken again before ``exp4``);
    with ``exist_ok`` ``base/name`` itself, existing or not. Each directory is claimed by its mkdir, so two runs
    started at once never share one. A file in the way is a UserError naming it and ``where`` (the flag)."""
    check_run_place(base, name, exist_ok, where)
    base = Path(base)
    if exist_ok:
        (base / name).mkdir(parents=True, exist_ok=True)
        return base / name
    base.mkdir(parents=True, exist_ok=True)
    n = 1
    while True:
        candidate = base / (name if n == 1 else f"{name}{n}")
        try:
            candidate.mkdir()
            return candidate
        except FileExistsError:
            n += 1


# What a run writes before its first step: the resolved config, the options, the start of its log, the ranks' logs.
PLAN_FILE = "run_plan.json"   # rank 0 writes the RunPlan the ranks trained into the run directory
STARTUP_FILES = ("config.yml", "opt.yaml", "hyp.yaml", "args.yaml", PLAN_FILE, "train.log")


def unstarted(run_dir: Path | str) -> bool:
    """Whether ``run_dir`` holds only what a run writes before its first step (STARTUP_FILES, logs/*.log, an empty
    weights/): a run refused at start made it, and nothing in it is worth keeping."""
    root = Path(run_dir)
    if not root.is_dir():
        return False
    for path in root.rglob("*"):
        parts = path.relative_to(root).parts
        if path.is_symlink():
            return False
        if path.is_dir():
            if parts in (("weights",), ("logs",)):
                continue
            return False
        if (len(parts) == 1 and parts[0] in STARTUP_FILES) or \
                (len(parts) == 2 and parts[0] == "logs" and parts[1].endswith(".log")):
            continue
        return False
    return True


def newest_run(output: str | None) -> Path:
    """Bare ``--resume``: the most recently written ``weights/last`` under the usual run roots."""
    roots = [Path(output).parent] if output else [Path("runs/train"), Path("output")]
    found = [p for root in roots if root.is_dir() for p in root.glob("*/weights/last.pdstate")]
    if not found:
        raise UserError(f"--resume without a path: no run with weights/last.pdstate under "
                        f"{' or '.join(map(str, roots))}; pass the run directory")
    return max(found, key=lambda p: p.stat().st_mtime).parent.parent


def run_of(resume: str | Path) -> Path:
    """The run directory of a ``--resume`` path: the directory itself, or the run of ``RUN/weights/last[.pdstate]``."""
    path = Path(resume)
    if path.is_dir():
        return path
    return path.parent.parent if path.parent.name == "weights" else path.parent


def resume_command(words: list[str], run_dir: Path | str) -> str:
    """The command that resumes ``run_dir``: the user's own command ``words`` with any ``--resume [X]`` (``-r X``)
    replaced by ``--resume RUN_DIR`` at its end, quoted for a POSIX shell."""
    kept: list[str] = []
    skip = False
    for i, word in enumerate(words):
        if skip:
            skip = False
            continue
        if word.startswith("--resume="):
            continue
        if word in ("--resume", "-r"):
            nxt = words[i + 1] if i + 1 < len(words) else None
            skip = nxt is not None and not nxt.startswith("-")   # bare --resume takes no value
            continue
        kept.append(word)
    return shlex.join([*kept, "--resume", str(run_dir)])
