"""YOLOv8 / YOLO11 / YOLO26 in ppmulti: sizes as ultralytics', the summary line, heads' outputs, ppdet's
architecture and configs, and ultralytics' checkpoints read without torch."""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pytest

import paddle  # noqa: E402 (installed with ppmulti)

from ppmulti.common.errors import UserError  # noqa: E402
from ppmulti.common.paths import CONFIGS  # noqa: E402
from ppmulti.rank.models.ultra_model import (UltraDetectionModel, guess_scale, load_spec,  # noqa: E402
                                             model_summary)

# ultralytics 8.4.190's own numbers for each model built from its yaml, measured (2026-12-01, CPU) in a venv with
# ultralytics 8.4.190 from PyPI, torch 2.14.1 (which its install pulled over 2.13.0) and ultralytics-thop 2.2.3:
#   from ultralytics.nn.tasks import DetectionModel; from ultralytics.utils.torch_utils import model_info
#   model_info(DetectionModel("yolo11n.yaml", verbose=False))  # logs and returns layers, params, grads, GFLOPs
#   -> "YOLO11n summary: 181 layers, 2,624,080 parameters, 2,624,064 gradients, 6.7 GFLOPs"
# The GFLOPs in the comments of ultralytics' yamls (YOLO11n 6.6, YOLO26n 6.1) predate thop's counting of the
# attention's matrix products; the parameter counts there are the same.
ULTRALYTICS = {
    "yolov8n": (129, 3_157_200, 3_157_184, 8.8550912),
    "yolov8s": (129, 11_166_560, 11_166_544, 28.8119296),
    "yolov8m": (169, 25_902_640, 25_902_624, 79.313664),
    "yolov8l": (209, 43_691_520, 43_691_504, 165.734656),
    "yolov8x": (209, 68_229_648, 68_229_632, 258.5370112),
    "yolo11n": (181, 2_624_080, 2_624_064, 6.6733184),
    "yolo11s": (181, 9_458_752, 9_458_736, 21.8363392),
    "yolo11m": (231, 20_114_688, 20_114_672, 68.643072),
    "yolo11l": (357, 25_372_160, 25_372_144, 87.8510592),
    "yolo11x": (357, 56_966_176, 56_966_160, 196.3150848),
    "yolo26n": (260, 2_572_280, 2_572_280, 6.2396672),
    "yolo26s": (260, 10_009_784, 10_009_784, 23.0793216),
    "yolo26m": (280, 21_896_248, 21_896_248, 75.6350976),
    "yolo26l": (392, 26_299_704, 26_299_704, 94.1582336),
    "yolo26x": (392, 58_993_368, 58_993_368, 210.0747264),
}


def _params(model) -> tuple[int, int]:
    # Paddle keeps BatchNorm's running statistics as frozen parameters (torch: buffers); count_parameters leaves
    # them out as ultralytics' count does
    from ppmulti.rank.models.ultra_model import count_parameters

    return count_parameters(model)


@pytest.mark.parametrize("name", sorted(ULTRALYTICS))
def test_parameter_counts_equal_ultralytics(name):
    model = UltraDetectionModel(f"{name}.yaml")
    layers, params, grads, _ = ULTRALYTICS[name]
    assert _params(model) == (params, grads)


@pytest.mark.parametrize("name", ["yolov8n", "yolo11n", "yolo26n"])
def test_summary_line_as_ultralytics(name):
    model = UltraDetectionModel(f"{name}.yaml")
    line, n_layers, params, grads, gflops = model_summary(model, model.spec.name)
    layers, want_params, want_grads, want_gflops = ULTRALYTICS[name]
    title = name.replace("yolo", "YOLO")
    assert line == (f"{title} summary: {layers:,} layers, {want_params:,} parameters, {want_grads:,} gradients, "
                    f"{want_gflops:.1f} GFLOPs")
    assert gflops == pytest.approx(want_gflops, rel=1e-9)


def test_scale_is_read_from_the_file_name(tmp_path):
    assert guess_scale("yolo11n.yaml") == "n" and guess_scale("path/yolov8x-custom.yaml") == "x"
    assert guess_scale("yolo26.yaml") == ""
    spec = load_spec("yolov8m.yaml")
    assert (spec.scale, spec.depth, spec.width, spec.max_channels) == ("m", 0.67, 0.75, 768)
    # a user's own file, in ultralytics' form, named with its scale
    own = tmp_path / "mynet-yolo11s.yaml"
    own.write_text((CONFIGS / "ultralytics" / "yolo11.yaml").read_text().replace("nc: 80", "nc: 3"))
    spec = load_spec(str(own))
    assert (spec.scale, spec.nc, spec.width) == ("s", 3, 0.5)
    with pytest.raises(UserError, match="not a shipped model description"):
        load_spec("yolo99n.yaml")
    bad = tmp_path / "bad-yolo11n.yaml"
    bad.write_text((CONFIGS / "ultralytics" / "yolo11.yaml").read_text().replace("C2PSA", "C2fPSA"))
    with pytest.raises(UserError, match="uses C2fPSA, which ppmulti does not build"):
        UltraDetectionModel(str(bad))


def test_batchnorm_and_bias_init_as_ultralytics():
    model = UltraDetectionModel("yolo26n.yaml", nc=3)
    bns = [m for m in model.sublayers() if isinstance(m, paddle.nn.BatchNorm2D)]
    assert bns and all((bn._epsilon, bn._momentum) == (1e-3, 0.97) for bn in bns)
    head = model.head
    assert head.stride == [8.0, 16.0, 32.0] and head.reg_max == 1 and head.end2end
    for branch in (head.cv3, head.one2one_cv3):
        for level, stride in zip(branch, (8, 16, 32)):
            np.testing.assert_allclose(level[-1].bias.numpy(), math.log(5 / 3 / (640 / stride) ** 2), rtol=1e-6)
    for branch in (head.cv2, head.one2one_cv2):
        assert all(np.all(level[-1].bias.numpy() == 2.0) for level in branch)
    # the one-to-one branch starts as a copy of the one-to-many one (ultralytics deep-copies it)
    np.testing.assert_array_equal(head.cv2[0][0].conv.weight.numpy(), head.one2one_cv2[0][0].conv.weight.numpy())
    dfl = UltraDetectionModel("yolov8n.yaml").head.dfl.conv.weight
    assert dfl.stop_gradient and dfl.numpy().reshape(-1).tolist() == list(range(16))


def test_state_names_are_ultralytics():
    names = set(UltraDetectionModel("yolo11n.yaml").state_dict())
    for key in ("model.0.conv.weight", "model.0.bn._mean", "model.0.bn._variance", "model.2.m.0.cv1.conv.weight",
                "model.10.m.0.attn.qkv.conv.weight", "model.23.cv3.0.0.0.conv.weight", "model.23.cv2.2.2.bias",
                "model.23.dfl.conv.weight"):
        assert key in names, key


@pytest.mark.parametrize("name", ["yolov8n", "yolo11n"])
def test_head_outputs_nms_models(name):
    model = UltraDetectionModel(f"{name}.yaml", nc=5)
    x = paddle.rand([2, 3, 64, 96])
    model.train()
    out = model(x)
    n = 8 * 12 + 4 * 6 + 2 * 3
    assert sorted(out) == ["boxes", "feats", "scores"]
    assert out["boxes"].shape == [2, 64, n] and out["scores"].shape == [2, 5, n]
    assert [f.shape[2:] for f in out["feats"]] == [[8, 12], [4, 6], [2, 3]]
    model.eval()
    y = model(x)
    assert y.shape == [2, 4 + 5, n]
    scores = y[:, 4:].numpy()
    assert scores.min() >= 0 and scores.max() <= 1


def test_head_outputs_end_to_end():
    model = UltraDetectionModel("yolo26n.yaml", nc=4)
    x = paddle.rand([1, 3, 64, 64])
    model.train()
    out = model(x)
    assert sorted(out) == ["one2many", "one2one"]
    for part in out.values():
        assert part["boxes"].shape == [1, 4, 84] and part["scores"].shape == [1, 4, 84]
    # the one-to-one branch reads detached features in training (its loss does not train the backbone)
    assert out["one2one"]["feats"][0].stop_gradient and not out["one2many"]["feats"][0].stop_gradient
    model.eval()
    y = model(x)
    assert y.shape == [1, 84, 6]   # min(max_det, anchors) rows: x1, y1, x2, y2, score, class
    scores = y[0, :, 4].numpy()
    assert np.all(np.diff(scores) <= 1e-7)
    assert set(np.unique(y[0, :, 5].numpy())) <= {0.0, 1.0, 2.0, 3.0}
    model.head.end2end = False
    assert model(x).shape == [1, 8, 84]


# ----------------------------------------------------------------------------- ppdet's workspace
class _StandInLoss:
    """A trivial loss for these tests only (ultralytics' losses are another module's): box and class means."""

    def __call__(self, head_outputs, inputs):
        parts = head_outputs["one2many"] if "one2many" in head_outputs else head_outputs
        box = parts["boxes"].mean()
        cls = parts["scores"].mean() + 0 * inputs["gt_bbox"].sum()
        return {"loss": box + cls, "loss_box": box, "loss_cls": cls, "loss_dfl": box * 0}


def _arch(config: str, **over):
    from ppdet.core.workspace import create

    from ppmulti.rank import config as config_mod

    cfg = config_mod.load(CONFIGS / config, {"UltraYOLO": {"loss": None, **over}, "num_classes": 3})
    model = create(cfg.architecture)
    model.loss = _StandInLoss()
    return model


@pytest.mark.parametrize("config", ["yolov8/yolov8_n_500e_coco.yml", "yolo11/yolo11_n_500e_coco.yml",
                                    "yolo26/yolo26_n_500e_coco.yml"])
def test_architecture_in_ppdet(config):
    model = _arch(config)
    assert type(model).__name__ == "UltraYOLO" and model.num_classes == 3
    batch = {"image": paddle.rand([2, 3, 64, 64]), "gt_bbox": paddle.to_tensor([[[4.0, 4, 30, 30]], [[8, 8, 60, 40]]]),
             "gt_class": paddle.to_tensor([[[1]], [[2]]], dtype="int32"), "pad_gt_mask": paddle.ones([2, 1, 1])}
    model.train()
    losses = model(batch)
    assert set(losses) == {"loss", "loss_box", "loss_cls", "loss_dfl"}
    losses["loss"].backward()
    grads = [p for p in model.parameters() if p.grad is not None]
    assert grads
    model.eval()
    out = model({"image": paddle.rand([2, 3, 64, 64]), "im_shape": paddle.to_tensor([[64.0, 64], [64, 64]]),
                 "scale_factor": paddle.to_tensor([[1.0, 1.0], [0.5, 0.5]])})
    bbox, num = out["bbox"].numpy(), out["bbox_num"].numpy()
    assert bbox.shape[1] == 6 and num.shape == (2,)
    if num.sum():
        assert bbox.shape[0] == num.sum()
        assert set(np.unique(bbox[:, 0])) <= {0.0, 1.0, 2.0}


def test_end_to_end_post_process_keeps_confident_rows():
    model = _arch("yolo26/yolo26_n_500e_coco.yml")
    model.eval()
    y = paddle.to_tensor([[[10.0, 20, 30, 40, 0.9, 2], [0, 0, 8, 8, 0.5, 1], [1, 1, 2, 2, 0.0005, 0]],
                          [[2.0, 4, 6, 8, 0.0001, 0], [2, 4, 6, 8, 0.00001, 0], [0, 0, 1, 1, 0.0, 0]]])
    bbox, num = model.post_process(y, paddle.to_tensor([[2.0, 2.0], [1.0, 1.0]]))
    assert num.numpy().tolist() == [2, 0]
    np.testing.assert_allclose(bbox.numpy(), [[2, 0.9, 5, 10, 15, 20], [1, 0.5, 0, 0, 4, 4]], rtol=1e-6)


def test_model_names_resolve_to_configs(tmp_path):
    from ppmulti.rank.yolo_config import resolve_cfg

    assert resolve_cfg("yolo11n.yaml").config.endswith("configs/yolo11/yolo11_n_500e_coco.yml")
    assert resolve_cfg("yolo26x").config.endswith("configs/yolo26/yolo26_x_500e_coco.yml")
    own = tmp_path / "custom-yolo26s.yaml"
    own.write_text((CONFIGS / "ultralytics" / "yolo26.yaml").read_text())
    choice = resolve_cfg(str(own))
    assert choice.config.endswith("yolo26_n_500e_coco.yml") and choice.overrides == {"UltraYOLO": {"model": str(own)}}


# ----------------------------------------------------------------------------- ultralytics' .pt without torch
def _torch_name(key: str) -> str:
    return key.replace("._mean", ".running_mean").replace("._variance", ".running_var")


def _write_ultralytics_pt(path: Path, model: UltraDetectionModel, yaml_file: str, half: bool = True,
                          release: bool = True):
    """A file laid out as ultralytics 8.4 saves a checkpoint: a dict whose 'ema' is a pickled DetectionModel."""
    import ptwriter

    state = {_torch_name(k): v.numpy().astype(np.float16 if half else np.float32)
             for k, v in model.state_dict().items()}
    for k in list(state):
        if k.endswith(".running_var"):
            state[k[: -len("running_var")] + "num_batches_tracked"] = np.array(7, dtype=np.int64)
    detect = f"model.{len(model.model) - 1}"
    spec = model.spec
    yaml = dict(spec.raw, scale=spec.scale, yaml_file=yaml_file, channels=3, nc=spec.nc)
    ema = ptwriter.module_tree(state, "ultralytics.nn.tasks.DetectionModel",
                               classes={"model": "torch.nn.modules.container.Sequential",
                                        detect: "ultralytics.nn.modules.head.Detect",
                                        "model.0": "ultralytics.nn.modules.conv.Conv"},
                               yaml=yaml, shape=ptwriter.Size(1, 64, 80, 80),
                               names={i: f"c{i}" for i in range(spec.nc)},
                               stride=ptwriter.Tensor(np.array([8.0, 16.0, 32.0], dtype=np.float32)),
                               args={"imgsz": 640, "task": "detect"}, save=[4, 6, 10])
    ckpt = {"date": "2026-11-30T10:00:00", "version": "8.4.190", "license": "AGPL-3.0 License",
            "docs": "https://docs.ultralytics.com", "epoch": -1 if release else 3, "best_fitness": None,
            # ultralytics' stripped files (a release, a finished run) keep the ema as 'model'; a checkpoint saved
            # during training keeps it as 'ema', with the optimizer's state
            "model": ema if release else None, "ema": None if release else ema, "updates": None if release else 120,
            "optimizer": None if release else {"state": {0: {"momentum_buffer": ptwriter.Tensor(np.zeros(3))}},
                                               "param_groups": [{"lr": 0.01, "params": [0]}]},
            "train_args": {"model": yaml_file, "epochs": 4, "imgsz": 64, "batch": 2},
            "train_metrics": {"metrics/mAP50(B)": 0.1}, "train_results": {"epoch": [1, 2]}, "git": {"branch": "main"}}
    return ptwriter.save(ckpt, path), state


@pytest.mark.parametrize("name", ["yolo11n", "yolo26n"])
def test_ultralytics_checkpoint_converts_and_loads(tmp_path, name):
    from ppmulti.rank.engine.pretrained import load_initial_weights
    from ppmulti.rank.models.convert import pdparams_for
    from ppmulti.rank.models.ultra_convert import read_ultra_pt

    paddle.seed(1)
    source = UltraDetectionModel(f"{name}.yaml", nc=3)
    release = name == "yolo11n"   # a stripped file (ema as 'model'), or a checkpoint from during training
    pt, state = _write_ultralytics_pt(tmp_path / "best.pt", source, f"{name}.yaml", release=release)
    read = read_ultra_pt(str(pt))
    kind = "weights" if release else "checkpoint"
    assert (read.kind, read.cfg, read.num_classes, read.names) == (kind, name, 3, ["c0", "c1", "c2"])
    assert read.info["version"] == "8.4.190" and read.info["train_args"]["epochs"] == 4
    path, first = pdparams_for(str(pt))
    assert first is not None and pdparams_for(str(pt)) == (path, None)   # converted once, then the cache
    paddle.seed(2)
    target = _arch(f"{name[:-1]}/{name[:-1]}_n_500e_coco.yml")
    own = target.state_dict()
    assert set(own) == {k.replace(".running_mean", "._mean").replace(".running_var", "._variance")
                        for k in state if not k.endswith("num_batches_tracked")}

    class Cfg(dict):
        pass

    load_initial_weights(target, Cfg(num_classes=3), str(pt))
    loaded = target.state_dict()
    for key, value in state.items():
        if key.endswith("num_batches_tracked"):
            continue
        mine = key.replace(".running_mean", "._mean").replace(".running_var", "._variance")
        np.testing.assert_array_equal(loaded[mine].numpy(), value.astype(np.float32), err_msg=key)
    target.eval()
    out = target({"image": paddle.rand([1, 3, 64, 64]), "im_shape": paddle.to_tensor([[64.0, 64]]),
                  "scale_factor": paddle.to_tensor([[1.0, 1.0]])})
    assert out["bbox"].shape[1] == 6


def test_ultralytics_checkpoint_other_classes_reinitialises_class_outputs(tmp_path, caplog):
    from ppmulti.rank.engine.pretrained import load_initial_weights

    source = UltraDetectionModel("yolo11n.yaml", nc=80)
    pt, _ = _write_ultralytics_pt(tmp_path / "yolo11n.pt", source, "yolo11n.yaml", half=False)
    target = _arch("yolo11/yolo11_n_500e_coco.yml")

    class Cfg(dict):
        pass

    load_initial_weights(target, Cfg(num_classes=3), str(pt))
    assert target.state_dict()["model.23.cv3.0.2.bias"].shape == [3]
    np.testing.assert_array_equal(target.state_dict()["model.0.conv.weight"].numpy(),
                                  source.state_dict()["model.0.conv.weight"].numpy())


def test_release_name_through_the_mirror(tmp_path, monkeypatch):
    import argparse

    from test_pretrained import serve

    from ppmulti.common.envvars import PPMULTI_WEIGHTS_MIRROR, XDG_CACHE_HOME
    from ppmulti.rank.engine.pretrained import resolve_weights_flag

    monkeypatch.setenv(XDG_CACHE_HOME, str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    pt, _ = _write_ultralytics_pt(tmp_path / "src.pt", UltraDetectionModel("yolov8n.yaml"), "yolov8n.yaml")
    with serve({"yolov8n.pt": pt.read_bytes()}) as (url, hits):
        monkeypatch.setenv(PPMULTI_WEIGHTS_MIRROR, url)
        args = argparse.Namespace(weights="yolov8n.pt", cfg=None, config=None)
        assert resolve_weights_flag(args) == []
    assert hits == ["/v7.0/yolov8n.pt"]
    assert args.weights == str(tmp_path / "cache" / "ppmulti" / "weights" / "yolov8n.pt") and args.cfg == "yolov8n"


def test_other_ultralytics_tasks_are_refused(tmp_path):
    import ptwriter

    from ppmulti.rank.models.ultra_convert import read_ultra_pt

    seg = ptwriter.Module("ultralytics.nn.tasks.SegmentationModel",
                          parameters={"w": ptwriter.Tensor(np.zeros(2, np.float32), parameter=True)})
    pt = ptwriter.save({"model": seg, "ema": None}, tmp_path / "yolo11n-seg.pt")
    with pytest.raises(UserError, match="segmentation model"):
        read_ultra_pt(str(pt))


def test_val_thresholds_reach_ultrayolo_nms():
    from ppmulti.rank import config as config_mod
    from ppmulti.rank.eval_setup import _nms_sections

    cfg = config_mod.load(CONFIGS / "yolo11/yolo11_n_500e_coco.yml")
    sections = _nms_sections(cfg)
    assert len(sections) == 1 and sections[0]["nms_threshold"] == 0.7 and sections[0]["keep_top_k"] == 300


@pytest.mark.slow
@pytest.mark.parametrize("config", ["yolo11/yolo11_n_500e_coco.yml", "yolo26/yolo26_n_500e_coco.yml"])
def test_exported_inference_model_matches_dygraph(config, tmp_path):
    """ppdet's exporter on UltraYOLO (NMS, or YOLO26's top-k, in the graph); the predictor's rows equal dygraph's."""
    from paddle import inference

    from ppmulti.rank import compat
    from ppmulti.rank import config as config_mod
    from ppmulti.rank.engine.inference import export_model

    over = {"UltraYOLO": {"loss": None, "nms": {"score_threshold": 0.0}}, "eval_height": 64, "eval_width": 64}
    cfg = config_mod.load(CONFIGS / config, over)
    from ppdet.core.workspace import create

    paddle.seed(0)
    model = create(cfg.architecture)
    model.eval()
    out_dir = export_model(cfg, model, str(tmp_path))
    predictor = inference.create_predictor(compat.cpu_predictor_config(out_dir))
    feeds = {"image": np.random.default_rng(0).random((1, 3, 64, 64), dtype=np.float32),
             "im_shape": np.array([[64.0, 64.0]], np.float32), "scale_factor": np.array([[1.0, 1.0]], np.float32)}
    for name in predictor.get_input_names():
        predictor.get_input_handle(name).copy_from_cpu(feeds[name])
    predictor.run()
    rows = predictor.get_output_handle(predictor.get_output_names()[0]).copy_to_cpu()
    with paddle.no_grad():
        want = model({k: paddle.to_tensor(v) for k, v in feeds.items()})["bbox"].numpy()
    assert rows.shape == want.shape and rows.shape[0] > 0
    np.testing.assert_allclose(rows, want, atol=1e-4)


def test_val_reads_an_ultralytics_pt(tmp_path):
    """tools/val.py --weights best.pt (an ultralytics file): its family's config, its classes and names, its
    weights converted on load; the model predicts as the one that was saved."""
    import argparse

    from ppdet.core.workspace import create

    from ppmulti.rank import config as config_mod
    from ppmulti.rank.engine.checkpoint import load_weights
    from ppmulti.rank.eval_setup import resolve_model, weights_classes

    paddle.seed(4)
    source = UltraDetectionModel("yolo26n.yaml", nc=3)
    pt, _ = _write_ultralytics_pt(tmp_path / "best.pt", source, "yolo26n.yaml", half=False)
    args = argparse.Namespace(config=None, cfg=None, weights=str(pt), data=None)
    model = resolve_model(args)
    assert model.config.endswith("configs/yolo26/yolo26_n_500e_coco.yml") and model.names == ["c0", "c1", "c2"]
    assert model.overrides == {"num_classes": 3, "UltraYOLO": {"model": "yolo26n.yaml"}} and model.from_pt
    cfg = config_mod.load(model.config, {**model.overrides, "UltraYOLO": {**model.overrides["UltraYOLO"],
                                                                           "loss": None}})
    net = create(cfg.architecture)
    missing, unexpected = load_weights(net, model.weights)
    assert not missing and not unexpected
    assert weights_classes(net.state_dict()) == 3
    x = paddle.rand([1, 3, 64, 64])
    source.eval()
    net.eval()
    np.testing.assert_allclose(net._net(x).numpy(), source(x).numpy(), atol=1e-4)


# --half against Paddle (float32), both on the CPU, the same float32 inputs (64 px; the heads drawn by _spread_head):
# float16 keeps 11 significant bits, so a score near 1 steps by 5e-4 and a box corner near 64 px by 0.03 px, and
# ~100 layers of rounding add up. Measured on Paddle 3.3.1 + paddle2onnx 2.1.0 + onnxruntime 1.31 (2026-12-02):
# YOLOv8n boxes 0.11 px, scores 3.1e-4; YOLO26n 0.022 px, 2.3e-4 (and `ppmulti yolo predict` on the float16 files of
# 20-epoch YOLOv8n/YOLO11n/YOLO26n demo runs against their .pdparams: boxes within 0.045 px on 128 px images, conf
# within 1.3e-3). Scores are bounded absolutely, as a user reads them against conf= (test_export_half's bounds).
HALF_BOX_TOL = 1.0
HALF_SCORE_TOL = 5e-3


def _spread_head(state: dict, rng: np.random.Generator) -> dict:
    """A freshly built model's state with its head's output convolutions drawn at random: the initial biases
    (ultralytics' priors: class scores near 1e-4, every box of one size) make outputs that hardly depend on the
    image, so that float16 or a wrong input would pass unseen; drawn, scores spread over (0, 1) and boxes vary."""
    out = dict(state)
    for key, value in state.items():
        if re.fullmatch(r"model\.\d+\.(one2one_)?cv[23]\.\d+\.2\.(weight|bias)", key):
            scale = 0.05 if key.endswith("weight") else 1.0
            out[key] = paddle.to_tensor(rng.normal(0, scale, value.shape).astype(np.float32))
    return out


def _same_rows(got: np.ndarray, want: np.ndarray, score_tol: float, box_tol: float) -> float:
    """YOLO26's top-k rows (class, score, x1, y1, x2, y2) against Paddle's: the sorted scores agree, and each row
    above the cut has a Paddle row of its class within ``score_tol`` whose box is within ``box_tol`` (a random head
    ties many scores: which of the pairs tied at the lowest score kept fills the last rows is the runtime's pick).
    The worst box gap."""
    assert got.shape == want.shape
    np.testing.assert_allclose(np.sort(got[:, 1]), np.sort(want[:, 1]), atol=score_tol)
    cut = min(got[:, 1].min(), want[:, 1].min()) + 2 * score_tol
    worst = 0.0
    for row in got[got[:, 1] > cut]:
        near = want[(want[:, 0] == row[0]) & (np.abs(want[:, 1] - row[1]) <= score_tol)]
        gap = np.abs(near[:, 2:] - row[2:]).max(axis=1).min() if len(near) else np.inf
        worst = max(worst, float(gap))
    assert worst <= box_tol, worst
    return worst


@pytest.mark.slow
def test_onnx_export_runs_in_onnxruntime_as_in_paddle(tmp_path):
    """tools/export.py --format onnx's path on YOLO11n (NMS in the graph), YOLOv8n (left out, dynamic batch) and
    YOLO26n (its top-k in the graph): onnxruntime gives Paddle's predictor's outputs, also simplified (--simplify)
    and in float16 (--half, after --simplify as export runs them); the file carries its model card, from which
    predicting on a float16 file alone (tools/detect.py's OnnxBackend) gives the Paddle weights' outputs."""
    import onnxruntime   # the export extra, in the default install (setup.py) where paddle2onnx has a release
    from paddle import inference

    from ppmulti.rank import compat
    from ppmulti.rank.engine.detect import OnnxBackend, PaddleBackend
    from ppmulti.rank.engine.onnx_export import (OnnxOptions, card_config, export_onnx, read_metadata, simplify,
                                                 to_half)
    from ppmulti.rank.eval_setup import card_file

    rng = np.random.default_rng(0)
    feeds = {"image": rng.random((1, 3, 64, 64), dtype=np.float32), "im_shape": np.array([[64.0, 64.0]], np.float32),
             "scale_factor": np.array([[1.0, 1.0]], np.float32)}
    frame = rng.integers(0, 256, (48, 80, 3), dtype=np.uint8)   # not square: the letterbox and scale matter

    def run(model: Path | bytes) -> list:
        sess = onnxruntime.InferenceSession(model if isinstance(model, bytes) else str(model))
        return sess.run(None, {i.name: feeds[i.name] for i in sess.get_inputs()})

    def paddle_predictor(model_dir: Path) -> list:
        predictor = inference.create_predictor(compat.cpu_predictor_config(model_dir))
        for name in predictor.get_input_names():
            predictor.get_input_handle(name).copy_from_cpu(feeds[name])
        predictor.run()
        return [predictor.get_output_handle(n).copy_to_cpu() for n in predictor.get_output_names()]

    gaps = {}   # (model, variant) -> the largest box and score differences from Paddle's predictor
    for name, opts in (("yolo11", OnnxOptions()), ("yolov8", OnnxOptions(nms=False, dynamic=True)),
                       ("yolo26", OnnxOptions())):
        paddle.seed(0)
        end2end = name == "yolo26"
        weights = tmp_path / f"{name}.pdparams"
        state = UltraDetectionModel(f"{name}n.yaml").state_dict()
        # NMS in the graph keeps the initial head: drawn, its large overlapping boxes put IoUs within float32's
        # rounding of the threshold, and the two runtimes' NMS part ways there (one flip, then a cascade)
        paddle.save(state if opts.nms and not end2end else _spread_head(state, rng), str(weights))
        config = str(CONFIGS / f"{name}/{name}_n_500e_coco.yml")
        over = ["UltraYOLO.loss=null", "UltraYOLO.nms.score_threshold=0.0", "eval_height=64", "eval_width=64"]
        out = tmp_path / f"{name}-{opts.nms}"
        onnx_file = export_onnx(config, over, str(weights), str(out), opts)
        pd = paddle_predictor(onnx_file.parent)
        slim = simplify(onnx_file.read_bytes())   # as export runs --simplify, then --half
        half = to_half(slim)
        for what, model in (("float32", onnx_file), ("simplify", slim), ("half", half)):
            if what == "half" and opts.nms and not end2end:
                continue   # float16 scores move NMS's choices among the initial head's near-equal boxes
            ort = run(model)
            assert [a.shape for a in ort] == [b.shape for b in pd] and ort[0].shape[0] > 0, what
            score_tol, box_tol = (HALF_SCORE_TOL, HALF_BOX_TOL) if what == "half" else (1e-5, 1e-3)
            if end2end:
                box = _same_rows(ort[0], pd[0], score_tol, box_tol)
                score = float(np.abs(np.sort(ort[0][:, 1]) - np.sort(pd[0][:, 1])).max())
            elif opts.nms:   # rows class, score, x1, y1, x2, y2, in NMS's order
                box, score = (float(np.abs(ort[0][:, k] - pd[0][:, k]).max()) for k in (slice(2, 6), 1))
                assert (ort[0][:, 0] == pd[0][:, 0]).all() and (ort[1] == pd[1]).all(), what
            else:   # boxes [B, N, 4], scores [B, C, N]
                box, score = (float(np.abs(a - b).max()) for a, b in zip(ort, pd))
            assert box <= box_tol and score <= score_tol, (name, what, box, score)
            gaps[name, what] = (box, score)
        card = card_config(read_metadata(onnx_file))
        assert card is not None and card[1][:2] == ["person", "bicycle"] and len(card[1]) == 80   # COCO's names
        assert card[0]["architecture"] == "UltraYOLO" and "TrainDataset" not in card[0]
        if opts.nms and not end2end:
            continue
        # predicting on the float16 file alone, its card as the config, against predicting on the Paddle weights
        (out / "half.onnx").write_bytes(half)
        got = OnnxBackend(card_file(*card), [], out / "half.onnx", lambda cfg: None).predict(frame)
        want = PaddleBackend(config, over, str(weights), lambda cfg: None).predict(frame)
        if end2end:
            _same_rows(got.dets, want.dets, HALF_SCORE_TOL, HALF_BOX_TOL)
        else:
            np.testing.assert_allclose(got.boxes, want.boxes, atol=HALF_BOX_TOL)
            np.testing.assert_allclose(got.scores, want.scores, atol=HALF_SCORE_TOL)
    print("largest differences from Paddle (box px, score):",
          ", ".join(f"{n} {w} {b:.2g} {s:.2g}" for (n, w), (b, s) in gaps.items()))
    assert all(gaps[n, "half"][1] > 10 * gaps[n, "float32"][1] for n in ("yolov8", "yolo26"))   # float16 ran


def test_dfl_is_the_expected_bin_of_a_softmax_over_the_bins():
    """DFL as ultralytics computes it (a frozen 1x1 convolution with weights 0..reg_max-1 over the softmax on the
    bins' axis): per box side and anchor, the expected bin of the softmax over its reg_max logits."""
    from ppmulti.rank.models.ultra_blocks import DFL

    x = np.random.default_rng(0).normal(0, 3, (2, 4 * 16, 50)).astype("float32")
    got = DFL(16)(paddle.to_tensor(x)).numpy()
    logits = x.reshape(2, 4, 16, 50).astype("float64")
    probs = np.exp(logits - logits.max(axis=2, keepdims=True))
    probs /= probs.sum(axis=2, keepdims=True)
    want = (probs * np.arange(16).reshape(1, 1, 16, 1)).sum(axis=2)
    assert got.shape == (2, 4, 50) and np.abs(got - want).max() < 1e-5
