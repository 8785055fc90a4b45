"""The real trainer on 2 ranks with --sync-bn trains as 1 process at the same global batch (tools/train.py, YOLOv5's
flags, no augmentation): the same weights, BatchNorm statistics, EMA and losses to float tolerance."""

from __future__ import annotations

import csv

import numpy as np
import pytest
import yaml

from conftest import REPO, run_tool

AUG_KEYS = ("hsv_h", "hsv_s", "hsv_v", "degrees", "translate", "scale", "shear", "perspective", "flipud", "fliplr",
            "mosaic", "mixup", "copy_paste")


def _write_data(root, n_train: int = 16, n_val: int = 4, size: int = 64) -> str:
    """A YOLO data set whose every image holds one box of the same place and size (colours and classes vary): each
    rank's half of a batch then has as many anchor matches as the other, so the mean of the ranks' box and class
    losses (what the gradient all-reduce averages) is the mean over the whole batch, as one process computes it."""
    import cv2

    rng = np.random.default_rng(5)
    for split, n in (("train", n_train), ("val", n_val)):
        (root / "images" / split).mkdir(parents=True)
        (root / "labels" / split).mkdir(parents=True)
        for i in range(n):
            image = rng.integers(0, 80, (size, size, 3), dtype=np.uint8)
            cls = i % 3
            colour = [int(c) for c in rng.integers(120, 256, 3)]
            cv2.rectangle(image, (18, 22), (46, 40), colour, thickness=-1)
            cv2.imwrite(str(root / "images" / split / f"{i:03d}.png"), image)
            (root / "labels" / split / f"{i:03d}.txt").write_text(
                f"{cls} {32 / size:.6f} {31 / size:.6f} {29 / size:.6f} {19 / size:.6f}\n")
    data = root / "data.yaml"
    data.write_text(yaml.safe_dump({"path": str(root), "train": "images/train", "val": "images/val", "nc": 3,
                                    "names": ["a", "b", "c"]}))
    return str(data)


def _load(path):
    import paddle

    return {k: np.asarray(v.numpy() if hasattr(v, "numpy") else v, dtype=np.float64)
            for k, v in paddle.load(str(path)).items() if hasattr(v, "shape")}


def _distance(a: dict, b: dict) -> float:
    return float(np.sqrt(sum(((a[k] - b[k]) ** 2).sum() for k in a)))


@pytest.mark.slow
@pytest.mark.multiproc
def test_two_ranks_with_sync_bn_train_as_one_process(tmp_path):
    data = _write_data(tmp_path / "data")
    hyp = yaml.safe_load((REPO / "configs" / "hyps" / "hyp.scratch-low.yaml").read_text())
    hyp.update({k: 0.0 for k in AUG_KEYS})
    (tmp_path / "hyp.yaml").write_text(yaml.safe_dump(hyp))
    common = [str(REPO / "tools" / "train.py"), "--data", data, "--cfg", "yolov5n.yaml", "--weights", "", "--hyp",
              str(tmp_path / "hyp.yaml"), "--img", "64", "--epochs", "2", "--batch", "8", "--device", "cpu",
              "--workers", "0", "--seed", "0", "--noval", "--noplots", "--save-period", "1"]
    runs = {}
    for name, extra in (("one", []), ("two", ["--nproc", "2", "--sync-bn"])):
        proc = run_tool(common + extra + ["--output", str(tmp_path / name)], cwd=tmp_path)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        runs[name] = tmp_path / name / "weights"
    import paddle

    states = {name: paddle.load(str(path / "last.pdstate")) for name, path in runs.items()}
    one, two = ({k: np.asarray(v.numpy(), np.float64) for k, v in states[name]["model"].items()} for name in runs)
    assert one.keys() == two.keys()
    # the EMA weights: the second epoch moved them far more than the two runs differ (the control: a real training)
    ema_one, ema_two = _load(runs["one"] / "last.pdparams"), _load(runs["two"] / "last.pdparams")
    moved = _distance(ema_one, _load(runs["one"] / "epoch1.pdparams"))
    assert moved > 0.1 and _distance(ema_one, ema_two) < 1e-3 * moved, (_distance(ema_one, ema_two), moved)
    assert _distance(one, two) < 1e-3 * moved, (_distance(one, two), moved)
    for key in one:   # the weights and BatchNorm's running statistics, each to float32's summation-order noise
        np.testing.assert_allclose(two[key], one[key], rtol=1e-3, atol=2e-5, err_msg=key)
    assert states["one"]["hooks"]["ema"]["step"] == states["two"]["hooks"]["ema"]["step"]
    assert states["one"]["train"]["global_step"] == states["two"]["train"]["global_step"] == 4
    # the final evaluation's losses (every validation image on both); the train loss in results.csv is rank 0's
    # half of each batch on 2 ranks (as YOLOv5 logs it), so it is not compared
    rows = {name: list(csv.DictReader(open(tmp_path / name / "results.csv")))[-1] for name in runs}
    for column in ("val/box_loss", "val/obj_loss", "val/cls_loss"):
        assert float(rows["one"][column]) > 0
        np.testing.assert_allclose(float(rows["two"][column]), float(rows["one"][column]), rtol=1e-3, err_msg=column)


@pytest.mark.slow
@pytest.mark.multiproc
def test_a_sharded_evaluation_scores_rank_0s_batchnorm_statistics(tmp_path):
    """With per-rank BatchNorm the ranks' running statistics differ; each rank scores its shard of the eval set, so
    each takes rank 0's (the weights it saves) first. Trained parameters are left as they are (equal anyway)."""
    from launching import FIXTURES

    script = str(FIXTURES / "rank0_statistics_ranks.py")
    proc = run_tool(["-m", "ppmulti.cli", "launch", "--nproc_per_node", "2", script, str(tmp_path)], cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ranks = [np.load(tmp_path / f"rank{r}.npz") for r in (0, 1)]
    stats = [k[len("after:"):] for k in ranks[0].files if k.startswith("after:") and k.endswith(("_mean", "_variance"))]
    assert len(stats) == 4 and int(ranks[0]["taken"]) == int(ranks[1]["taken"]) == 4
    for key in stats:
        assert not np.allclose(ranks[1][f"before:{key}"], ranks[0][f"before:{key}"])   # the control: they differed
        for r in (0, 1):
            np.testing.assert_array_equal(ranks[r][f"after:{key}"], ranks[0][f"before:{key}"])
    for key in (k[len("after:"):] for k in ranks[0].files if k.startswith("after:")):
        if key not in stats:   # weights and biases: untouched
            np.testing.assert_array_equal(ranks[1][f"after:{key}"], ranks[1][f"before:{key}"])
