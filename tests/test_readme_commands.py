"""README's and the quickstart page's command blocks, run as typed in one fresh directory after README's install (the
environment running the tests): epochs and image counts shortened with flags the commands already take; lines
that need GPUs, other machines or a cluster run as dry runs; the install lines are the environment itself."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO
from test_docs import SUBSTITUTE, commands

PAGES = [REPO / "README.md", REPO / "docs" / "index.md"]

# Shorter runs of the same commands (flags each command already takes), by the command's start.
SHORTER = [
    ("ppmulti demo", " --epochs 1"),
    ("ppmulti data demo", " --train 16 --val 4 --size 128"),
    ("python tools/train.py -c", " --epochs 1 -o snapshot_epoch=1"),   # evaluated, so weights/best is written
    ("ppmulti launch --nproc_per_node 2 tools/train.py", " --epochs 1 -o snapshot_epoch=1"),
]


def _needs_elsewhere(command: str) -> bool:
    """GPUs, other machines, a SLURM allocation or a pod's variables: shown as a dry run here."""
    words = shlex.split(command)
    return "MASTER_ADDR=" in command or any(w in words for w in ("--gpus", "--nodes", "--nnodes"))


def plan(pages: list[Path]) -> list[tuple[str, str]]:
    """(the command as shown, what runs): pip lines and the test suite are skipped; a command shown twice runs once."""
    out, seen = [], set()
    for page in pages:
        for command in commands(page.read_text()):
            # pip lines are this environment; the suite runs itself; an `srun` line needs a SLURM allocation
            # (tests/test_cluster_env.py runs it on a two-node SLURM cluster it starts)
            if command.startswith(("pip ", "python -m pytest", "srun ")) or command in seen:
                continue
            seen.add(command)
            run = command.replace("--epochs 30", "--epochs 1")   # YOLOv5's line gives its epochs
            for start, extra in SHORTER:
                if command.startswith(start) and "--epochs" not in command:
                    run = run + extra
                    break
            if _needs_elsewhere(command):
                run = run.replace("ppmulti launch", "ppmulti launch --dry-run", 1) if "--dry-run" not in run else run
                for placeholder, value in SUBSTITUTE.items():
                    run = run.replace(placeholder, value)
            out.append((command, run))
    return out


def test_the_plan_covers_every_block():
    shown = plan(PAGES)
    commands_run = [c for c, _ in shown]
    for needed in ("ppmulti demo", "ppmulti data demo dataset/demo --format yolo",
                   "python tools/export.py --weights runs/train/exp/weights/best.pdparams --include onnx",
                   "python tools/detect.py --weights runs/train/exp/weights/best.onnx --source dataset/demo/images/val "
                   "--save-txt"):
        assert needed in commands_run
    assert not any("--epochs 30" in run for _, run in shown)
    dry = [run for _, run in shown if "--dry-run" in run]
    assert len(dry) >= 4 and all("10.0.0." not in run for run in dry)
    assert not any(run.startswith(("pip", "python -m pytest", "srun")) for _, run in shown)


@pytest.mark.slow
@pytest.mark.skipif(sys.version_info >= (3, 13), reason="README: on Python 3.13 the ONNX export line runs in a "
                                                         "3.10-3.12 venv (paddle2onnx has no 3.13 release)")
def test_readme_and_quickstart_commands_run_as_typed(tmp_path):
    cwd = tmp_path / "fresh"
    cwd.mkdir()
    for part in ("tools", "configs"):   # a checkout's scripts and configs, and nothing else
        (cwd / part).symlink_to(REPO / part)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
           "PYTHONPATH": str(REPO)}
    for name in ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "SLURM_JOB_ID", "SLURM_STEP_NUM_NODES"):
        env.pop(name, None)
    for command, run in plan(PAGES):
        proc = subprocess.run(["bash", "-c", run], cwd=cwd, env=env, capture_output=True, text=True, timeout=900)
        assert proc.returncode == 0, f"{command}\n(ran: {run})\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    assert (cwd / "runs" / "train" / "exp" / "weights" / "best.onnx").is_file()
    # both detect lines (the .pdparams and the .onnx) drew the 4 val images (a 1-epoch model may find no box, so
    # --save-txt may write no label file)
    drawn = {d.name: len(list(d.glob("*.jpg"))) for d in (cwd / "runs" / "detect").glob("exp*")}
    assert drawn == {"exp": 4, "exp2": 4}, drawn
    assert (cwd / "output" / "ppyoloe_demo" / "weights" / "best.pdparams").is_file()
