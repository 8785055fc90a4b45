"""Collective training for real: several gloo ranks on this CPU, started by ppmulti's and Paddle's launchers."""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import DEMO_CONFIG, demo_overrides, run_tool

pytestmark = [pytest.mark.multiproc, pytest.mark.slow]


def _train_args(data, out, *extra):
    return ["tools/train.py", "-c", str(DEMO_CONFIG), "-o", *demo_overrides(data), *extra, "--output", str(out)]


def test_two_ranks_train_eval_checkpoint(small_demo, tmp_path):
    out = tmp_path / "run"
    proc = run_tool(["-m", "ppmulti.cli", "launch", "--nproc_per_node", "2",
                     *_train_args(small_demo, out, "--batch", "8", "--epochs", "2", "--eval")])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["world_size"] == 2 and metrics["global_batch"] == 8
    assert metrics["images"] == 16                     # every val image scored once across the 2 shards
    assert len(metrics["per_rank_images_per_s"]) == 2
    log0 = (out / "train.log").read_text()
    assert "world size 2, global batch 8 (4 per rank)" in log0
    assert "lr 0.004 = base_lr 0.004 x global batch 8 / ref_batch 8" in log0
    assert (out / "logs" / "rank1.log").is_file()      # rank 1 logs to its own file only
    assert (out / "weights" / "last.pdparams").is_file() and (out / "weights" / "best.pdparams").is_file()
    assert not list(out.glob("weights/*rank1*"))


def test_train_py_device_cpu_nproc_relaunches(small_demo, tmp_path):
    out = tmp_path / "run"
    proc = run_tool(_train_args(small_demo, out, "--device", "cpu", "--nproc", "2", "--epochs", "1"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert json.loads((out / "metrics.json").read_text())["world_size"] == 2


def test_paddle_launcher_without_ppmulti(small_demo, tmp_path):
    out = tmp_path / "run"
    proc = run_tool(["-m", "paddle.distributed.launch", "--log_dir", str(tmp_path / "plog"), "--nproc_per_node", "2",
                     *_train_args(small_demo, out, "--epochs", "1")])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    metrics = json.loads((out / "metrics.json").read_text())
    # ppdet semantics when no --batch is given: TrainReader.batch_size (8) per rank
    assert metrics["world_size"] == 2 and metrics["global_batch"] == 16


def test_global_batch_not_divisible(small_demo, tmp_path):
    proc = run_tool(["-m", "ppmulti.cli", "launch", "--nproc_per_node", "2",
                     *_train_args(small_demo, tmp_path / "run", "--batch", "7")])
    assert proc.returncode != 0
    logs = proc.stdout + proc.stderr + "".join(p.read_text() for p in tmp_path.rglob("*.log"))
    logs += "".join(p.read_text() for p in tmp_path.rglob("workerlog*"))
    assert "--batch 7 is not divisible by the world size 2" in logs or \
        "--batch 7 is not divisible by the world size 2" in _worker_logs()


def _worker_logs() -> str:
    from pathlib import Path

    return "".join(p.read_text(errors="replace") for p in Path("log").glob("workerlog*")) if Path("log").is_dir() else ""


def test_sync_bn_on_cpu_stops_clearly(small_demo, tmp_path):
    proc = run_tool(["-m", "ppmulti.cli", "launch", "--nproc_per_node", "2",
                     *_train_args(small_demo, tmp_path / "run", "--batch", "8", "--sync-bn")])
    assert proc.returncode != 0
    text = proc.stdout + proc.stderr + "".join(p.read_text(errors="replace") for p in tmp_path.rglob("*.log"))
    text += _worker_logs()
    assert "no CPU kernel for sync_batch_norm" in text


def _weights(npz):
    data = np.load(npz)
    return {k: data[k] for k in data.files}


def test_two_ranks_equal_one_rank_with_double_batch(tmp_path, repo):
    script = str(repo / "tests" / "fixtures" / "equivalence_train.py")
    one = run_tool([script, str(tmp_path / "one.npz"), "8", "6"])
    assert one.returncode == 0, one.stderr[-2000:]
    two = run_tool(["-m", "ppmulti.cli", "launch", "--nproc_per_node", "2", script, str(tmp_path / "two.npz"), "8", "6"])
    assert two.returncode == 0, two.stdout[-2000:] + two.stderr[-2000:]
    half = run_tool([script, str(tmp_path / "half.npz"), "4", "6"])
    assert half.returncode == 0
    a, b, c = _weights(tmp_path / "one.npz"), _weights(tmp_path / "two.npz"), _weights(tmp_path / "half.npz")
    for key in a:
        np.testing.assert_allclose(a[key], b[key], rtol=1e-5, atol=1e-6)
    # the control: a different global batch really gives different weights
    assert max(np.abs(a[k] - c[k]).max() for k in a) > 1e-4
