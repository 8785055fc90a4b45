"""Real short trainings: the same --seed gives the same losses on CPU (1 and 2 ranks), another seed other losses;
a set smaller than the batch trains per rank with its shard, fewer images than ranks is refused by name."""

from __future__ import annotations

import csv

import pytest

from conftest import REPO, run_tool

pytestmark = pytest.mark.slow

LOSSES = ("loss", "loss_box", "loss_obj", "loss_cls")


@pytest.fixture(scope="module")
def sets(tmp_path_factory):
    from ppmulti.common.synthdata import generate

    root = tmp_path_factory.mktemp("seeds")
    for name, n in (("eight", 8), ("one", 1), ("five", 5)):
        generate(root / name, fmt="yolo", n_train=n, n_val=2, size=64, seed=1)
    return root


def _train(root, data, name, *extra):
    """1 epoch of YOLOv5n at 64 px (mosaic and the other augmentations on: the seed has randomness to fix)."""
    proc = run_tool([str(REPO / "tools" / "train.py"), "--imgsz", "64", "--batch", "4", "--weights", "",
                     "--cfg", "yolov5n", "--data", f"{data}/data.yaml", "--epochs", "1", "--device", "cpu",
                     "--noval", "--noplots", "--name", name, "--exist-ok", *extra], cwd=root, timeout=600)
    return proc


def _losses(root, name) -> dict[str, float]:
    rows = list(csv.DictReader((root / "runs" / "train" / name / "results.csv").open()))
    assert len(rows) == 1
    return {k: float(rows[0][k]) for k in LOSSES}


@pytest.mark.parametrize("ranks", [1, pytest.param(2, marks=pytest.mark.multiproc)])
def test_same_seed_same_losses_on_cpu(sets, ranks):
    extra = ["--workers", "2"] if ranks == 1 else ["--workers", "0", "--nproc", "2"]
    for name, seed in ((f"a{ranks}", "7"), (f"b{ranks}", "7"), (f"c{ranks}", "8")):
        proc = _train(sets, "eight", name, "--seed", seed, *extra)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    a, b, c = (_losses(sets, f"{x}{ranks}") for x in "abc")
    assert all(abs(a[k] - b[k]) <= 1e-6 for k in LOSSES), (a, b)
    assert a != c                       # the seed is what fixed them: another seed, other losses
    assert "deterministic mode (YOLOv5 command line" in proc.stdout + proc.stderr


@pytest.mark.multiproc
def test_small_set_on_two_ranks(sets):
    proc = _train(sets, "five", "five", "--batch", "32", "--workers", "0", "--nproc", "2")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    # 5 images on 2 ranks: each rank's shard is 3 (the sampler pads one), so both run one step of 3
    assert "5 images, fewer than the batch 32: training with batch 6 (3 per rank)" in proc.stdout + proc.stderr
    proc = _train(sets, "one", "one", "--batch", "32", "--workers", "0", "--nproc", "2")
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    out = proc.stdout + proc.stderr    # ranks' lines come through the launcher's console
    errors = {ln for ln in out.splitlines() if ln.startswith("error:")}   # each rank says the same line
    assert errors == {"error: the training set has 1 image(s), fewer than the 2 ranks: every rank needs at least "
                      "one; train on 1 rank(s) or add images"}, out[-2000:]
