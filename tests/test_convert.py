"""YOLOv5 v6 -> ppmulti weight names (ppmulti/rank/models/convert.py), tested as pure functions; no torch needed."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from ppmulti.common.errors import UserError
from ppmulti.rank.models.convert import convert_state_dict, map_name, read_torch_state

GOLDEN = [
    ("model.0.conv.weight", "backbone.stem.conv.weight"),
    ("model.0.bn.running_mean", "backbone.stem.bn._mean"),
    ("model.1.bn.running_var", "backbone.layers1.stage1.conv_layer.bn._variance"),
    ("model.2.cv3.bn.bias", "backbone.layers2.stage1.csp_layer.conv3.bn.bias"),
    ("model.4.m.1.cv2.conv.weight", "backbone.layers4.stage2.csp_layer.bottlenecks.1.conv2.conv.weight"),
    ("model.9.cv2.bn.weight", "backbone.layers9.stage4.sppf_layer.conv2.bn.weight"),
    ("model.10.conv.weight", "neck.lateral_convs.0.conv.weight"),
    ("model.13.m.0.cv1.conv.weight", "neck.fpn_blocks.0.bottlenecks.0.conv1.conv.weight"),
    ("model.14.bn.weight", "neck.lateral_convs.1.bn.weight"),
    ("model.18.conv.weight", "neck.downsample_convs.0.conv.weight"),
    ("model.23.cv1.bn.running_mean", "neck.pan_blocks.1.conv1.bn._mean"),
    ("model.24.m.2.bias", "yolo_head.convs.2.bias"),
    ("module.model.24.m.0.weight", "yolo_head.convs.0.weight"),      # saved from DDP
    ("model.0.bn.num_batches_tracked", None),
    ("model.24.anchors", None),
]


@pytest.mark.parametrize("name,expected", GOLDEN)
def test_map_name_golden(name, expected):
    assert map_name(name) == expected


@pytest.mark.parametrize("name", ["model.11.conv.weight", "model.12.weight", "backbone.stem.conv.weight",
                                  "model.24.m.0.conv.weight", "model.24.foo", "model.4.cv1.act.weight",
                                  "model.30.conv.weight"])
def test_map_name_refuses_what_yolov5_v6_has_not(name):
    with pytest.raises(ValueError):
        map_name(name)


def yolov5_v6_keys(depth: float) -> list[str]:
    """The state_dict keys of a YOLOv5 v6 P5 DetectionModel, written down from its yaml layout."""
    def conv(i, p=""):
        bn = ("weight", "bias", "running_mean", "running_var", "num_batches_tracked")
        return [f"model.{i}.{p}conv.weight"] + [f"model.{i}.{p}bn.{b}" for b in bn]

    def c3(i, n):
        keys = conv(i, "cv1.") + conv(i, "cv2.") + conv(i, "cv3.")
        for k in range(max(round(n * depth), 1)):
            keys += conv(i, f"m.{k}.cv1.") + conv(i, f"m.{k}.cv2.")
        return keys

    keys: list[str] = []
    for i in (0, 1, 3, 5, 7, 10, 14, 18, 21):
        keys += conv(i)
    for i, n in ((2, 3), (4, 6), (6, 9), (8, 3), (13, 3), (17, 3), (20, 3), (23, 3)):
        keys += c3(i, n)
    keys += conv(9, "cv1.") + conv(9, "cv2.")
    keys += ["model.24.anchors"] + [f"model.24.m.{j}.{w}" for j in range(3) for w in ("weight", "bias")]
    return keys


@pytest.mark.parametrize("size,depth", [("n", 0.33), ("s", 0.33), ("m", 0.67), ("l", 1.0)])
def test_every_yolov5_key_lands_on_exactly_one_ppmulti_parameter(size, depth):
    import ppmulti.rank.models  # noqa: F401  (registers the model)
    from ppdet.core.workspace import create

    from ppmulti.rank import config as config_mod
    from ppmulti.common.paths import CONFIGS

    cfg = config_mod.load(CONFIGS / f"yolov5/yolov5_{size}_300e_coco.yml", {"num_classes": 3})
    own = set(create(cfg.architecture).state_dict())
    mapped = [map_name(k) for k in yolov5_v6_keys(depth)]
    kept = [m for m in mapped if m is not None]
    assert len(kept) == len(set(kept)), "two YOLOv5 keys map onto one ppmulti key"
    assert set(kept) == own


def test_convert_state_dict_anchors_classes_and_dropped():
    grid = np.array([[[10, 13], [16, 30], [33, 23]], [[30, 61], [62, 45], [59, 119]],
                     [[116, 90], [156, 198], [373, 326]]], dtype=np.float32)
    grid /= np.array([8, 16, 32], dtype=np.float32).reshape(3, 1, 1)   # YOLOv5 keeps anchors / stride
    state = {"model.0.conv.weight": np.ones((16, 3, 6, 6), np.float32),
             "model.0.bn.num_batches_tracked": np.array(7),
             "model.24.anchors": grid,
             "model.24.m.0.weight": np.zeros((3 * (5 + 4), 64, 1, 1), np.float32)}
    out = convert_state_dict(state)
    assert out.params["backbone.stem.conv.weight"] is state["model.0.conv.weight"]   # values untouched
    assert out.anchors == [[[10, 13], [16, 30], [33, 23]], [[30, 61], [62, 45], [59, 119]],
                           [[116, 90], [156, 198], [373, 326]]]
    assert out.num_classes == 4
    assert sorted(out.dropped) == ["model.0.bn.num_batches_tracked", "model.24.anchors"]


def test_convert_state_dict_names_a_foreign_key():
    with pytest.raises(UserError, match="model.11.conv.weight.*yolov5n/s/m/l/x"):
        convert_state_dict({"model.11.conv.weight": np.zeros(1)})


def test_reading_a_missing_pt_names_it(tmp_path):
    with pytest.raises(UserError, match="yolov5s.pt: file not found"):
        read_torch_state(str(tmp_path / "yolov5s.pt"))


def test_the_tool_converts_without_torch(tmp_path, monkeypatch, capsys):
    import json

    import paddle

    from test_pretrained import release, yolov5_state

    monkeypatch.setitem(sys.modules, "torch", None)   # import torch -> ImportError, as without the package
    state = yolov5_state(nc=4)
    release(tmp_path / "yolov5n.pt", state, nc=4)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
    try:
        import convert_yolov5
    finally:
        sys.path.pop(0)
    out = tmp_path / "yolov5n.pdparams"
    assert convert_yolov5.main([str(tmp_path / "yolov5n.pt"), str(out), "--cfg", "yolov5n"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["num_classes"] == 4 and printed["parameters"] == len(paddle.load(str(out)))


def test_the_torch_free_path_gives_the_outputs_of_the_torch_path(tmp_path):
    """Today's converter read the .pt with torch.load; the torch-free reader must give a model the same outputs."""
    torch = pytest.importorskip("torch", reason="compares with the torch.load path")
    import paddle

    import ppmulti.rank.models  # noqa: F401
    from ppdet.core.workspace import create

    from ppmulti.common.paths import CONFIGS
    from ppmulti.rank import config as config_mod
    from test_pretrained import _torch_state, release, torch_load_standins, yolov5_state

    path = release(tmp_path / "yolov5n.pt", yolov5_state(nc=80, seed=3))
    ckpt = torch_load_standins(torch, path)
    by_torch = {k: v.detach().float().numpy() for k, v in _torch_state(ckpt["model"]).items()}
    by_reader = read_torch_state(str(path))
    cfg = config_mod.load(CONFIGS / "yolov5/yolov5_n_300e_coco.yml", {"num_classes": 80})
    image = paddle.to_tensor(np.random.default_rng(0).random((1, 3, 64, 64), dtype=np.float32))
    outputs = []
    for state in (by_torch, by_reader):
        model = create(cfg.architecture)
        model.set_state_dict({k: paddle.to_tensor(v) for k, v in convert_state_dict(state).params.items()})
        model.eval()
        outputs.append([f.numpy() for f in model.yolo_head(model.neck(model.backbone({"image": image})))])
    assert len(outputs[0]) == 3
    for a, b in zip(*outputs):
        np.testing.assert_array_equal(a, b)
