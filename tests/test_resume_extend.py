"""--resume with more epochs extends a finished run (issue 47, item 3): a 1-epoch YOLOv5n run (64 px, 16 images)
resumed with --epochs 2 or -o epoch=2 trains epoch 2 in the same run directory, results.csv gains its row, the lr
schedule is planned again for 2 epochs (each step of epoch 2 takes that schedule's lr) and one log line says so;
fewer epochs than done is one line, from the launching process (weights/last.json). Once on 2 ranks under
``ppmulti launch``."""

from __future__ import annotations

import csv
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO
from launching import launch_env
from ppmulti.rank.engine.checkpoint import Progress, read_progress

pytestmark = pytest.mark.slow

LINE = "extending {run} from 1 to 2 epochs (1 done): the lr schedule is re-planned for 2 epochs"


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    from ppmulti.common.synthdata import generate

    root = tmp_path_factory.mktemp("resume_extend") / "data"
    generate(root, fmt="yolo", n_train=16, n_val=4, size=64, seed=3)
    return root


def _train(data: Path, run: Path, *extra: str, launch: bool = False) -> subprocess.CompletedProcess:
    args = ["--imgsz", "64", "--batch", "4", "--weights", "", "--cfg", "yolov5n", "--data", str(data / "data.yaml"),
            "--epochs", "1", "--device", "cpu", "--noval", "--noplots", "--seed", "3", "--workers", "0",
            "--project", str(run.parent), "--name", run.name, "-o", "log_iter=1"]
    head = [sys.executable, "-m", "ppmulti.cli", "launch", "--nproc_per_node", "2", "--device", "cpu"] if launch \
        else [sys.executable]
    return subprocess.run([*head, str(REPO / "tools" / "train.py"), *args, *extra], cwd=run.parent,
                          capture_output=True, text=True, timeout=600, env=launch_env())


def _resume(run: Path, *extra: str, launch: bool = False) -> subprocess.CompletedProcess:
    head = [sys.executable, "-m", "ppmulti.cli", "launch", "--nproc_per_node", "2", "--device", "cpu"] if launch \
        else [sys.executable]
    return subprocess.run([*head, str(REPO / "tools" / "train.py"), "--resume", str(run), *extra], cwd=run.parent,
                          capture_output=True, text=True, timeout=600, env=launch_env())


@pytest.fixture(scope="module")
def one_epoch(data, tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("one_epoch") / "exp"
    proc = _train(data, run)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert read_progress(run / "weights" / "last.pdstate") == Progress(1, False, 1)   # the launching process's
    return run


def _step_lrs(log: str, epoch: int) -> list[float]:
    """The lr each logged step of ``epoch`` trained with (log_iter=1: every step)."""
    import re

    return [float(m.group(1)) for m in re.finditer(rf"epoch {epoch}/\d+ step \d+/\d+ .* lr=(\S+) ", log)]


def _replanned_lrs(total_epochs: int, epoch: int, batches: int = 4) -> list[float]:
    """YOLOv5's linear decay (lrf 0.01, base lr 0.01) planned for ``total_epochs``, at each batch of ``epoch``
    (0-based): the lr counts batches on a YOLOv5 command line, and its warmup (here 3 epochs, at least 100 batches,
    at most a third of the run) ends before the decay starts."""
    from ppmulti.rank.engine.lr import yolov5_warmup_batches
    from ppmulti.rank.ppdet_bridge import LinearDecay

    total = total_epochs * batches
    start = yolov5_warmup_batches(3.0, batches, total)
    decay = LinearDecay(total_epochs, 0.01)
    return [decay.lr_at(0.01, step, start, total) for step in range(epoch * batches, (epoch + 1) * batches)]


def _rows(run: Path) -> list[dict]:
    return list(csv.DictReader((run / "results.csv").open()))


def _check_extended(first: Path, run: Path, proc: subprocess.CompletedProcess) -> None:
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    log = (run / "train.log").read_text()
    assert log.count(LINE.format(run=run)) == 1, log[-3000:]
    rows = _rows(run)
    assert [r["epoch"] for r in rows] == ["1", "2"] and rows[0] == _rows(first)[0]
    expected = _replanned_lrs(2, 1)
    assert expected[0] > 0.006   # the 1-epoch schedule had ended at 0.0001: the extension's lr is planned again
    assert _step_lrs(log, 2) == pytest.approx(expected, rel=1e-3, abs=1e-6)   # the log prints 3 significant digits
    assert json.loads((run / "metrics.json").read_text())["epochs"] == 2
    assert [p for p in run.parent.iterdir() if (p / "weights").is_dir()] == [run]   # the same run, no new one
    assert "epoch: 2" in (run / "config.yml").read_text().splitlines()   # a bare --resume later trains to 2
    # the sidecar the launching process reads (no Paddle there): 2 done of 2 planned, so fewer is refused at once
    assert read_progress(run / "weights" / "last.pdstate") == Progress(2, False, 2)


@pytest.mark.parametrize("flags,fewer", [(["--epochs", "2"], ["-o", "epoch=1"]),
                                         (["-o", "epoch=2"], ["--epochs", "1"])], ids=["--epochs", "-o epoch="])
def test_resume_with_more_epochs_extends_the_run_and_replans_its_lr(one_epoch, tmp_path, flags, fewer):
    """Then fewer epochs than the 2 done is one line, by either spelling."""
    run = tmp_path / "exp"
    shutil.copytree(one_epoch, run)
    _check_extended(one_epoch, run, _resume(run, *flags))
    proc = _resume(run, *fewer)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1] == (
        f"error: --resume {run}: the run has 2 epoch(s) done, but this start trains to 1 (--epochs / -o epoch=); "
        f"give 2 or more (more extends the run), or leave it out"), proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr


@pytest.mark.multiproc
def test_two_ranks_extend_a_run_of_two_ranks(data, tmp_path):
    first = tmp_path / "first" / "exp"
    first.parent.mkdir()
    proc = _train(data, first, launch=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    run = tmp_path / "again" / "exp"
    shutil.copytree(first, run)
    _check_extended(first, run, _resume(run, "--epochs", "2", launch=True))
