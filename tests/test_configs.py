"""Every shipped config loads through ppdet's load_config, builds its model and runs forward passes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ppmulti.rank import config as config_mod
from ppmulti.common.errors import UserError, first_line
from ppmulti.common.flags import parse_overrides

REPO = Path(__file__).resolve().parents[1]
SHIPPED = sorted(p for p in (REPO / "configs").rglob("*.yml")
                 if "_base_" not in p.parts and p.parent.name != "datasets" and p.name != "runtime.yml")


def _fake_batch(size: int, n: int = 2):
    import paddle

    rng = np.random.RandomState(0)
    gt_bbox = np.zeros((n, 3, 4), "float32")
    gt_class = np.zeros((n, 3, 1), "int32")
    pad = np.zeros((n, 3, 1), "float32")
    for i in range(n):
        for j in range(2):
            x, y = rng.uniform(0, size / 2, 2)
            w, h = rng.uniform(size / 8, size / 2, 2)
            gt_bbox[i, j] = [x, y, x + w, y + h]
            gt_class[i, j] = j
            pad[i, j] = 1
    return {
        "image": paddle.to_tensor(rng.rand(n, 3, size, size).astype("float32")),
        "im_shape": paddle.to_tensor(np.full((n, 2), size, "float32")),
        "scale_factor": paddle.to_tensor(np.ones((n, 2), "float32")),
        "gt_bbox": paddle.to_tensor(gt_bbox), "gt_class": paddle.to_tensor(gt_class),
        "pad_gt_mask": paddle.to_tensor(pad), "epoch_id": 0,
    }


def test_first_line_of_any_exception():
    """One-line errors quote an exception's first non-empty line, or its type when it has no message."""
    assert first_line(ValueError("\n  mapping values are not allowed here\n  in line 3")) == \
        "mapping values are not allowed here"
    assert first_line(ConnectionError()) == "ConnectionError"


def test_configs_are_found():
    names = {p.name for p in SHIPPED}
    for size in "smlx":
        assert f"ppyoloe_crn_{size}_300e_coco.yml" in names
    assert "yolo.yml" in names and "ppyoloe_demo.yml" in names


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: str(p.relative_to(REPO / "configs")))
def test_config_builds_and_runs(path):
    import paddle
    from ppdet.core.workspace import create

    size = 128
    cfg = config_mod.load(path, [f"eval_height={size}", f"eval_width={size}", "pretrain_weights=''"])
    assert cfg["filename"] == path.stem
    paddle.set_device("cpu")
    paddle.seed(0)
    model = create(cfg.architecture)
    model.train()
    out = model(_fake_batch(size))
    assert np.isfinite(float(out["loss"].numpy().reshape(-1)[0]))
    model.eval()
    with paddle.no_grad():
        out = model(_fake_batch(size))
    assert out["bbox"].shape[-1] == 6 and list(out["bbox_num"].shape) == [2]


def test_loads_do_not_leak_into_each_other():
    a = config_mod.load(REPO / "configs/demo/ppyoloe_demo.yml", ["epoch=3"])
    assert a["epoch"] == 3 and a["width_mult"] == 0.25
    b = config_mod.load(REPO / "configs/ppyoloe/ppyoloe_crn_l_300e_coco.yml")
    assert b["epoch"] == 300 and b["width_mult"] == 1.0
    assert "ref_batch" in b and b["TrainReader"]["batch_size"] == 8


def test_eval_size_follows_height_and_width():
    # without the sync the base reader's YAML anchors keep eval_size at 640 (ppdet would then fail)
    cfg = config_mod.load(REPO / "configs/yolo.yml", ["eval_height=320", "eval_width=416"])
    assert cfg["eval_size"] == [320, 416]
    resize = [op["Resize"] for op in cfg["EvalReader"]["sample_transforms"] if "Resize" in op][0]
    assert resize["target_size"] == [320, 416]
    assert cfg["TestReader"]["inputs_def"]["image_shape"] == [3, 320, 416]


def test_override_values_are_yaml():
    cfg = config_mod.load(REPO / "configs/yolo.yml", ["LearningRate.base_lr=0.02", "use_ema=false",
                                                       "TrainReader.batch_size=4"])
    assert cfg["LearningRate"]["base_lr"] == 0.02 and cfg["use_ema"] is False
    assert cfg["TrainReader"]["batch_size"] == 4


@pytest.mark.parametrize("bad", ["epochs=3", "TrainReader.batchsize=4", "LearningRate.lr=1"])
def test_unknown_override_key_is_named(bad):
    with pytest.raises(UserError) as err:
        config_mod.load(REPO / "configs/yolo.yml", [bad])
    assert bad.split("=")[0] in str(err.value)


def test_override_without_equals():
    with pytest.raises(UserError, match="key=value"):
        parse_overrides(["epoch"])


def test_missing_config_file(tmp_path):
    with pytest.raises(UserError, match="config file not found"):
        config_mod.load(tmp_path / "nope.yml")


def test_missing_base_file_is_named(tmp_path):
    cfg = tmp_path / "child.yml"
    cfg.write_text("_BASE_: ['./missing_base.yml']\nepoch: 1\n")
    with pytest.raises(UserError, match="missing_base.yml"):
        config_mod.load(cfg)


def test_resolved_config_is_plain_yaml(tmp_path):
    import yaml

    cfg = config_mod.load(REPO / "configs/demo/ppyoloe_demo.yml")
    config_mod.dump(cfg, tmp_path / "c.yml")
    data = yaml.safe_load((tmp_path / "c.yml").read_text())
    assert data["architecture"] == "YOLOv3" and data["PPYOLOEHead"]["static_assigner_epoch"] == 0
