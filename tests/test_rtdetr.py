"""RT-DETR from PaddleDetection release/2.7's configs on ppdet 2.6.0: the configs load unchanged and build (the
modules ppmulti adds: HybridEncoder, RTDETRTransformer, PPHGNetV2, DETRPostProcess, and release/2.7's DETR, ResNet,
DINOLoss, RandomDistort and RandomCrop over 2.6.0's), a shrunk config of the same form trains on 2 ranks with
--eval, and a config naming what neither ppdet 2.6.0 nor ppmulti has is refused in one line naming its release."""

from __future__ import annotations

import json
import random
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import REPO, run_tool
from launching import launch_env
from test_ppdet_zoo import write_checkout, write_coco

from ppmulti.common.errors import UserError
from ppmulti.rank import config as config_mod

# ----------------------------------------------------------------------------- release/2.7's RT-DETR configs

# configs/rtdetr/_base_/ of PaddleDetection release/2.7, key for key (comments left out)
OPTIMIZER_6X = """\
epoch: 72

LearningRate:
  base_lr: 0.0001
  schedulers:
  - !PiecewiseDecay
    gamma: 1.0
    milestones: [100]
    use_warmup: true
  - !LinearWarmup
    start_factor: 0.001
    steps: 2000

OptimizerBuilder:
  clip_grad_by_norm: 0.1
  regularizer: false
  optimizer:
    type: AdamW
    weight_decay: 0.0001
"""

RTDETR_R50VD = """\
architecture: DETR
pretrain_weights: https://paddledet.bj.bcebos.com/models/pretrained/ResNet50_vd_ssld_v2_pretrained.pdparams
norm_type: sync_bn
use_ema: True
ema_decay: 0.9999
ema_decay_type: "exponential"
ema_filter_no_grad: True
hidden_dim: 256
use_focal_loss: True
eval_size: [640, 640]

DETR:
  backbone: ResNet
  neck: HybridEncoder
  transformer: RTDETRTransformer
  detr_head: DINOHead
  post_process: DETRPostProcess

ResNet:
  depth: 50
  variant: d
  norm_type: bn
  freeze_at: 0
  return_idx: [1, 2, 3]
  lr_mult_list: [0.1, 0.1, 0.1, 0.1]
  num_stages: 4
  freeze_stem_only: True

HybridEncoder:
  hidden_dim: 256
  use_encoder_idx: [2]
  num_encoder_layers: 1
  encoder_layer:
    name: TransformerLayer
    d_model: 256
    nhead: 8
    dim_feedforward: 1024
    dropout: 0.
    activation: 'gelu'
  expansion: 1.0

RTDETRTransformer:
  num_queries: 300
  position_embed_type: sine
  feat_strides: [8, 16, 32]
  num_levels: 3
  nhead: 8
  num_decoder_layers: 6
  dim_feedforward: 1024
  dropout: 0.0
  activation: relu
  num_denoising: 100
  label_noise_ratio: 0.5
  box_noise_scale: 1.0
  learnt_init_query: False

DINOHead:
  loss:
    name: DINOLoss
    loss_coeff: {class: 1, bbox: 5, giou: 2}
    aux_loss: True
    use_vfl: True
    matcher:
      name: HungarianMatcher
      matcher_coeff: {class: 2, bbox: 5, giou: 2}

DETRPostProcess:
  num_top_queries: 300
"""

RTDETR_READER = """\
worker_num: 4
TrainReader:
  sample_transforms:
    - Decode: {}
    - RandomDistort: {prob: 0.8}
    - RandomExpand: {fill_value: [123.675, 116.28, 103.53]}
    - RandomCrop: {prob: 0.8}
    - RandomFlip: {}
  batch_transforms:
    - BatchRandomResize: {target_size: [480, 512, 544, 576, 608, 640, 640, 640, 672, 704, 736, 768, 800], \
random_size: True, random_interp: True, keep_ratio: False}
    - NormalizeImage: {mean: [0., 0., 0.], std: [1., 1., 1.], norm_type: none}
    - NormalizeBox: {}
    - BboxXYXY2XYWH: {}
    - Permute: {}
  batch_size: 4
  shuffle: true
  drop_last: true
  collate_batch: false
  use_shared_memory: true

EvalReader:
  sample_transforms:
    - Decode: {}
    - Resize: {target_size: [640, 640], keep_ratio: False, interp: 2}
    - NormalizeImage: {mean: [0., 0., 0.], std: [1., 1., 1.], norm_type: none}
    - Permute: {}
  batch_size: 4
  shuffle: false
  drop_last: false

TestReader:
  inputs_def:
    image_shape: [3, 640, 640]
  sample_transforms:
    - Decode: {}
    - Resize: {target_size: [640, 640], keep_ratio: False, interp: 2}
    - NormalizeImage: {mean: [0., 0., 0.], std: [1., 1., 1.], norm_type: none}
    - Permute: {}
  batch_size: 1
  shuffle: false
  drop_last: false
"""

BASES = ("  '../datasets/coco_detection.yml',\n  '../runtime.yml',\n  '_base_/optimizer_6x.yml',\n"
         "  '_base_/rtdetr_r50vd.yml',\n  '_base_/rtdetr_reader.yml',\n")

# configs/rtdetr/rtdetr_r18vd_6x_coco.yml of release/2.7
R18VD = f"""\
_BASE_: [
{BASES}]

weights: output/rtdetr_r18_6x_coco/model_final
find_unused_parameters: True
log_iter: 200

pretrain_weights: https://paddledet.bj.bcebos.com/models/pretrained/ResNet18_vd_pretrained.pdparams
ResNet:
  depth: 18
  variant: d
  return_idx: [1, 2, 3]
  freeze_at: -1
  freeze_norm: false
  norm_decay: 0.

HybridEncoder:
  hidden_dim: 256
  use_encoder_idx: [2]
  num_encoder_layers: 1
  encoder_layer:
    name: TransformerLayer
    d_model: 256
    nhead: 8
    dim_feedforward: 1024
    dropout: 0.
    activation: 'gelu'
  expansion: 0.5
  depth_mult: 1.0

RTDETRTransformer:
  eval_idx: -1
  num_decoder_layers: 3
"""

# configs/rtdetr/rtdetr_hgnetv2_l_6x_coco.yml of release/2.7
HGNETV2_L = f"""\
_BASE_: [
{BASES}]

weights: output/rtdetr_hgnetv2_l_6x_coco/model_final
pretrain_weights: https://bj.bcebos.com/v1/paddledet/models/pretrained/PPHGNetV2_L_ssld_pretrained.pdparams
find_unused_parameters: True
log_iter: 200

DETR:
  backbone: PPHGNetV2

PPHGNetV2:
  arch: 'L'
  return_idx: [1, 2, 3]
  freeze_stem_only: True
  freeze_at: 0
  freeze_norm: True
  lr_mult_list: [0., 0.05, 0.05, 0.05, 0.05]
"""

RELEASE_27 = {"configs/rtdetr/_base_/optimizer_6x.yml": OPTIMIZER_6X,
              "configs/rtdetr/_base_/rtdetr_r50vd.yml": RTDETR_R50VD,
              "configs/rtdetr/_base_/rtdetr_reader.yml": RTDETR_READER,
              "configs/rtdetr/rtdetr_r18vd_6x_coco.yml": R18VD,
              "configs/rtdetr/rtdetr_hgnetv2_l_6x_coco.yml": HGNETV2_L}


def _params(model) -> int:
    return sum(int(np.prod(p.shape)) for p in model.parameters())


@pytest.fixture(scope="module")
def release27(tmp_path_factory) -> Path:
    return write_checkout(tmp_path_factory.mktemp("PaddleDetection"), RELEASE_27)


# the parameter counts PaddleDetection release/2.7's configs/rtdetr/README.md lists (millions): the models built
# here count 20.21 M and 33.04 M with COCO's 80 classes (the backbone, encoder and decoder of each have the same
# parameter names and shapes as release/2.7's own modules, checked side by side with its source on 2026-12-01)
@pytest.mark.parametrize("name, readme_millions", [("rtdetr_r18vd_6x_coco", 20), ("rtdetr_hgnetv2_l_6x_coco", 32)])
def test_release27_config_loads_and_builds_unchanged(release27, monkeypatch, name, readme_millions):
    from ppdet.core.workspace import create

    monkeypatch.chdir(release27)
    cfg = config_mod.load(f"configs/rtdetr/{name}.yml", ["use_gpu=false"])
    model = create(cfg["architecture"])
    assert type(model.transformer).__name__ == "RTDETRTransformer"
    assert type(model.neck).__name__ == "HybridEncoder"
    assert abs(_params(model) / 1e6 - readme_millions) < 1.1


def test_freeze_stem_only_trains_every_stage():
    from ppmulti.rank.models.rtdetr.release27 import ResNet

    net = ResNet(depth=18, variant="d", freeze_at=0, freeze_stem_only=True, freeze_norm=False, return_idx=[1, 2, 3])
    assert all(p.stop_gradient for p in net.conv1.parameters())
    # Paddle keeps BatchNorm's running statistics as parameters that never take a gradient
    assert not any(p.stop_gradient for n, p in net.res_layers[0].named_parameters()
                   if not n.endswith(("_mean", "_variance")))
    old = ResNet(depth=18, variant="d", freeze_at=0, freeze_norm=False, return_idx=[1, 2, 3])   # 2.6's: stem, res2
    assert all(p.stop_gradient for p in old.res_layers[0].parameters())


def test_distort_and_crop_take_release27_prob():
    from ppmulti.rank.models.rtdetr.release27 import RandomCrop, RandomDistort

    image = np.full((40, 50, 3), 100, np.float32)
    sample = {"image": image.copy(), "gt_bbox": np.array([[5, 5, 30, 30]], np.float32),
              "gt_class": np.array([[0]], np.int32), "h": 40, "w": 50}
    for op in (RandomDistort(prob=0.0), RandomCrop(prob=0.0)):
        out = op(dict(sample))
        assert np.array_equal(out["image"], image) and np.array_equal(out["gt_bbox"], sample["gt_bbox"])
    changed = RandomDistort(prob=1.0, hue=[-18, 18, 0.0], saturation=[0.5, 1.5, 0.0], contrast=[0.5, 1.5, 0.0],
                            brightness=[0.5, 1.5, 0.0])(dict(sample))
    assert changed["image"].shape == image.shape      # 2.6's probabilities are of skipping each distortion


def test_random_distort_distorts_as_release27():
    """release/2.7's colour operations (PIL's HSV hue shift, ImageEnhance's saturation, contrast, brightness) in
    2.7's random order and draws: the same seed gives the same pixels as release/2.7's own RandomDistort, measured
    with it (tests/fixtures/release27_distort.json says how), in both orders (random_apply) and with the channel
    swap."""
    import importlib.util

    from ppmulti.rank.models.rtdetr.release27 import RandomDistort

    path = Path(__file__).parent / "fixtures" / "release27_distort_measure.py"
    spec = importlib.util.spec_from_file_location("release27_distort_measure", path)
    measure = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(measure)
    expected = json.loads((path.parent / "release27_distort.json").read_text())["outputs"]
    got = measure.outputs(RandomDistort)
    assert got.keys() == expected.keys()
    image = measure.image().astype(int).ravel().tolist()
    assert sum(got[k] != image for k in got) >= 9          # most cases do distort: the comparison has teeth
    for key in expected:
        assert got[key] == expected[key], key
    # without ``prob`` (a 2.6 config's RandomDistort: {}, the demo's) it is 2.6.0's operator, draw for draw
    import ppdet.data.transform.operators as ops

    for seed in (0, 1):
        outs = []
        for cls in (RandomDistort, ops.RandomDistort):
            random.seed(seed)
            np.random.seed(seed)
            outs.append(cls()({"image": measure.image().astype(np.float32)})["image"])
        assert np.array_equal(outs[0], outs[1])


def test_overrides_are_where_ppdet_looks_names_up():
    import ppdet.data.transform as transform
    from ppdet.core.workspace import global_config

    from ppmulti.rank.models.rtdetr import release27, release27_overrides
    from ppmulti.rank.ppdet_bridge import register_extensions

    register_extensions()
    assert release27_overrides() == []          # idempotent
    for cls in release27.OVERRIDES:
        assert global_config[cls.__name__].pymodule is release27
    for cls in release27.TRANSFORM_OVERRIDES:
        assert getattr(transform, cls.__name__) is cls
    assert "neck" in global_config["DETR"].schema and "use_vfl" in global_config["DINOLoss"].schema


# ----------------------------------------------------------------------------- newer than this ppdet: one line

FOCALNET = f"""\
_BASE_: [
{BASES}]
weights: output/rtdetr_focalnet_L_384_3x_coco/model_final
DETR:
  backbone: FocalNet
FocalNet:
  arch: 'focalnet_L_384_22k_fl4'
  out_indices: [1, 2, 3]
"""


def test_a_module_of_a_newer_release_is_named_in_one_line(release27, monkeypatch):
    (release27 / "configs/rtdetr/rtdetr_focalnet_L_384_3x_coco.yml").write_text(FOCALNET)
    monkeypatch.chdir(release27)
    with pytest.raises(UserError) as err:
        config_mod.load("configs/rtdetr/rtdetr_focalnet_L_384_3x_coco.yml", ["use_gpu=false"])
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith("configs/rtdetr/rtdetr_focalnet_L_384_3x_coco.yml: FocalNet (DETR.backbone) is "
                              "PaddleDetection release/2.7's; this ppdet is 2.6.0"), message


def test_an_argument_of_a_newer_release_is_named(release27, monkeypatch):
    text = R18VD.replace("RTDETRTransformer:\n", "DINOHead:\n  eval_idx: -1\n\nRTDETRTransformer:\n")
    (release27 / "configs/rtdetr/eval_idx.yml").write_text(text)
    reader = RTDETR_READER.replace("- Decode: {}\n    - RandomDistort", "- Decode: {rtn_im_file: true}\n"
                                   "    - RandomDistort", 1)
    (release27 / "configs/rtdetr/_base_/develop_reader.yml").write_text(reader)
    (release27 / "configs/rtdetr/decode.yml").write_text(R18VD.replace("rtdetr_reader.yml", "develop_reader.yml"))
    monkeypatch.chdir(release27)
    with pytest.raises(UserError, match=r"DINOHead\(eval_idx=\.\.\.\) \(DINOHead\) is PaddleDetection release/2.7's"):
        config_mod.load("configs/rtdetr/eval_idx.yml", ["use_gpu=false"])
    with pytest.raises(UserError, match=r"Decode\(rtn_im_file=\.\.\.\) \(TrainReader.sample_transforms\) is "
                                        r"PaddleDetection develop"):
        config_mod.load("configs/rtdetr/decode.yml", ["use_gpu=false"])
    (release27 / "configs/rtdetr/typo.yml").write_text(R18VD.replace("  freeze_norm: false\n",
                                                                     "  freeze_norm: false\n  frezee_at: 1\n"))
    with pytest.raises(UserError, match=r"ResNet\(frezee_at=\.\.\.\) \(ResNet\) is not in ppdet 2.6.0 nor in what "
                                        r"ppmulti adds: misspelt"):
        config_mod.load("configs/rtdetr/typo.yml", ["use_gpu=false"])


def test_train_tool_says_a_newer_config_in_one_line(release27):
    (release27 / "configs/rtdetr/rtdetr_focalnet_L_384_3x_coco.yml").write_text(FOCALNET)
    rel = "configs/rtdetr/rtdetr_focalnet_L_384_3x_coco.yml"
    proc = run_tool([str(REPO / "tools" / "train.py"), "-c", rel, "-o", "use_gpu=false", "epoch=1"], cwd=release27,
                    timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert lines[-1].startswith(f"error: {rel}: FocalNet (DETR.backbone) is PaddleDetection release/2.7's"), \
        proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr


# ----------------------------------------------------------------------------- a shrunk RT-DETR trains on 2 ranks

# rtdetr_r18vd_6x_coco in the same form, shrunk as tests/test_ppdet_zoo.py shrinks its families: hidden_dim 64,
# one encoder layer of 128, 2 decoder layers, 30 queries and 20 denoising queries, images of 64-96 px (the
# encoder's FPN needs sides divisible by 32), batch 2
SMALL_MODEL = (RTDETR_R50VD.replace("hidden_dim: 256", "hidden_dim: 64").replace("eval_size: [640, 640]",
                                                                                "eval_size: [96, 96]")
               .replace("norm_type: sync_bn", "norm_type: bn")
               .replace("  hidden_dim: 256\n", "  hidden_dim: 64\n").replace("d_model: 256", "d_model: 64")
               .replace("dim_feedforward: 1024", "dim_feedforward: 128").replace("num_queries: 300", "num_queries: 30")
               .replace("num_decoder_layers: 6", "num_decoder_layers: 2").replace("num_denoising: 100",
                                                                                  "num_denoising: 20")
               .replace("num_top_queries: 300", "num_top_queries: 30").replace("depth: 50", "depth: 18"))
SMALL_READER = (RTDETR_READER.replace("worker_num: 4", "worker_num: 0")
                .replace("[480, 512, 544, 576, 608, 640, 640, 640, 672, 704, 736, 768, 800]", "[64, 96]")
                .replace("[640, 640]", "[96, 96]").replace("[3, 640, 640]", "[3, 96, 96]")
                .replace("batch_size: 4", "batch_size: 2").replace("  use_shared_memory: true\n", ""))
SMALL = {"configs/rtdetr/_base_/optimizer_6x.yml": OPTIMIZER_6X.replace("steps: 2000", "steps: 10"),
         "configs/rtdetr/_base_/rtdetr_r18vd.yml": SMALL_MODEL,
         "configs/rtdetr/_base_/rtdetr_reader.yml": SMALL_READER,
         "configs/rtdetr/rtdetr_r18vd_small_coco.yml": R18VD.replace("rtdetr_r50vd.yml", "rtdetr_r18vd.yml")
         .replace("hidden_dim: 256", "hidden_dim: 64").replace("d_model: 256", "d_model: 64")
         .replace("dim_feedforward: 1024", "dim_feedforward: 128").replace("num_decoder_layers: 3",
                                                                           "num_decoder_layers: 2")
         # the stem frozen, as release/2.7's R34-vd to R101-vd have it, with its EMA (ema_filter_no_grad)
         .replace("freeze_at: -1", "freeze_at: 0")
         .replace("weights: output/rtdetr_r18_6x_coco/model_final", "weights: output/rtdetr_r18vd_small_coco/"
                  "model_final")}
SMALL_CONFIG = "configs/rtdetr/rtdetr_r18vd_small_coco.yml"


def test_small_config_trains_a_step_and_predicts(tmp_path, monkeypatch):
    """Forward, backward and prediction of the shrunk model in this process: every loss term finite, predictions
    of num_top_queries boxes per image."""
    import paddle
    from ppdet.core.workspace import create

    write_checkout(tmp_path, SMALL)
    monkeypatch.chdir(tmp_path)
    cfg = config_mod.load(SMALL_CONFIG, ["use_gpu=false", "num_classes=3"])
    paddle.seed(0)
    model = create(cfg["architecture"])
    images = paddle.rand([2, 3, 96, 96])   # eval_size: the encoder keeps its eval position embeddings
    inputs = {"image": images, "im_shape": paddle.to_tensor([[96., 96.], [96., 96.]]),
              "scale_factor": paddle.ones([2, 2]),
              "gt_bbox": [paddle.to_tensor([[0.5, 0.5, 0.2, 0.3]]), paddle.to_tensor([[0.3, 0.4, 0.1, 0.1],
                                                                                      [0.7, 0.6, 0.3, 0.2]])],
              "gt_class": [paddle.to_tensor([[1]], dtype="int32"), paddle.to_tensor([[0], [2]], dtype="int32")]}
    model.train()
    losses = model(inputs)
    for key in ("loss_class", "loss_bbox", "loss_giou", "loss_class_aux", "loss_class_dn", "loss_giou_aux_dn"):
        assert key in losses and np.isfinite(losses[key].numpy()).all(), (key, losses.get(key))
    losses["loss"].backward()
    grads = [p.grad for p in model.transformer.parameters() if not p.stop_gradient]
    assert any(g is not None and g.abs().sum().numpy().item() > 0 for g in grads)
    model.eval()
    with paddle.no_grad():
        out = model({k: inputs[k] for k in ("image", "im_shape", "scale_factor")})
    assert out["bbox"].shape == [60, 6] and out["bbox_num"].numpy().tolist() == [30, 30]


@pytest.mark.slow
@pytest.mark.multiproc
@pytest.mark.seam
def test_small_rtdetr_trains_an_epoch_on_two_ranks_and_evaluates(tmp_path):
    """What a PaddleDetection user types, from their checkout: ``ppmulti launch --nproc_per_node 2
    <ppmulti>/tools/train.py -c configs/rtdetr/<config>.yml --eval -o epoch=1 use_gpu=false``; then --resume,
    eval.py --classwise and export_model.py on what it wrote, and its ONNX conversion in onnxruntime."""
    root = write_checkout(tmp_path / "PaddleDetection", SMALL)
    write_coco(root)
    proc = subprocess.run([sys.executable, "-m", "ppmulti.cli", "launch", "--nproc_per_node", "2",
                           str(REPO / "tools" / "train.py"), "-c", SMALL_CONFIG, "--eval", "-o", "epoch=1",
                           "use_gpu=false", "pretrain_weights="], cwd=root, env=launch_env(),
                          capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert 0.0 <= summary["mAP50"] <= 1.0 and 0.0 <= summary["mAP50_95"] <= summary["mAP50"]
    assert re.search(r"world size 2, global batch 4 \(2 per rank\)", out), out[-4000:]
    run = root / summary["run_dir"]
    assert (run / "config.yml").is_file()

    # then, in one process each: resume to a second epoch, evaluate per class, export for Paddle inference
    common = ["-c", SMALL_CONFIG, "-o", "use_gpu=false", "pretrain_weights=", "num_classes=3"]
    proc = run_tool([str(REPO / "tools" / "train.py"), *common, "epoch=2", "--resume", str(run)], cwd=root,
                    timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "resumed from" in (run / "train.log").read_text()
    assert len((run / "results.csv").read_text().strip().splitlines()) == 3     # a header, epochs 1 and 2
    weights = str(run / "weights" / "last.pdparams")
    proc = run_tool([str(REPO / "tools" / "eval.py"), *common, f"weights={weights}", "--classwise"], cwd=root,
                    timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert set(json.loads(proc.stdout.strip().splitlines()[-1])["class_AP"]) == {"rectangle", "ellipse", "triangle"}
    proc = run_tool([str(REPO / "tools" / "export_model.py"), *common, f"weights={weights}", "--output_dir",
                     str(root / "inference")], cwd=root, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    model_dir = root / "inference" / "rtdetr_r18vd_small_coco"
    assert (model_dir / "model.pdiparams").is_file()
    _onnx_runs_as_paddle(model_dir)


def _onnx_runs_as_paddle(model_dir: Path) -> None:
    """tools/export.py --format onnx's conversion (paddle2onnx through the version seam, the batch fixed to 1) of
    the exported RT-DETR: onnxruntime gives what Paddle's predictor gives on one image, box for box."""
    import onnxruntime   # the export extra, in the default install (setup.py)
    from paddle import inference

    from ppmulti.rank import compat
    from ppmulti.rank.engine.onnx_export import OnnxOptions, fix_batch

    sess = onnxruntime.InferenceSession(fix_batch(compat.paddle_to_onnx(model_dir, OnnxOptions().opset), 1))
    rng = np.random.default_rng(0)
    feeds = {"image": rng.random((1, 3, 96, 96), dtype=np.float32), "im_shape": np.array([[96.0, 96.0]], np.float32),
             "scale_factor": np.array([[1.0, 1.0]], np.float32)}
    ort = sess.run(None, {i.name: feeds[i.name] for i in sess.get_inputs()})
    predictor = inference.create_predictor(compat.cpu_predictor_config(model_dir))
    for name in predictor.get_input_names():
        predictor.get_input_handle(name).copy_from_cpu(feeds[name])
    predictor.run()
    paddle_out = [predictor.get_output_handle(n).copy_to_cpu() for n in predictor.get_output_names()]
    assert [a.shape for a in ort] == [b.shape for b in paddle_out] == [(30, 6), (1,)]
    np.testing.assert_array_equal(ort[1], paddle_out[1])
    # row for row, in either order: the top-k's order of nearly tied scores is free (an untrained release/2.7
    # R18-vd at 640 px swapped two rows 1e-8 apart between the two runtimes, which agreed within 2.5e-4 otherwise)
    gap = np.abs(ort[0][:, None, :] - paddle_out[0][None, :, :]).max(-1)
    assert gap.min(1).max() <= 1e-3 and gap.min(0).max() <= 1e-3, (gap.min(1).max(), gap.min(0).max())


def test_ema_filter_no_grad_keeps_frozen_weights_out_of_the_average():
    """F14 (compat.model_ema): ppdet 2.6.0's ModelEMA raises on ema_filter_no_grad with a frozen weight, which
    release/2.7's RT-DETR configs set; here the frozen weight is black-listed (kept, not averaged)."""
    import paddle

    from ppmulti.rank import compat

    model = paddle.nn.Sequential(paddle.nn.Linear(2, 2), paddle.nn.Linear(2, 2))
    model[0].weight.stop_gradient = True
    ema = compat.model_ema(model, decay=0.5, ema_filter_no_grad=True)
    frozen = [n for n, p in model.named_parameters() if p.stop_gradient]
    assert frozen and set(frozen) <= set(ema.ema_black_list)
    ema.update()
    averaged = ema.apply()
    assert np.allclose(averaged[frozen[0]].numpy(), model[0].weight.numpy())


def test_only_module_like_values_are_looked_up():
    from ppmulti.rank.newer import _looks_like_a_class

    assert _looks_like_a_class("HybridEncoder") and _looks_like_a_class("PPHGNetV2")
    assert not any(_looks_like_a_class(v) for v in ("NCHW", "bn", "d", "gelu", "L", "sine"))


def test_train_batch_picture_draws_rtdetr_boxes_in_pixels(monkeypatch, tmp_path):
    """RT-DETR's reader hands the model boxes as centre and size in 0-1 (NormalizeBox, BboxXYXY2XYWH) and one
    array per image (collate_batch: false); train_batch*.jpg draws them in the image's pixels."""
    from types import SimpleNamespace

    from ppmulti.rank.engine import pictures
    from ppmulti.rank.engine.hooks import plots

    drawn = []
    monkeypatch.setattr(pictures, "draw_mosaic", lambda batch, names, path: drawn.append(batch))
    cfg = {"TrainReader": {"batch_transforms": [{"NormalizeImage": {"norm_type": "none"}}, {"NormalizeBox": {}},
                                                {"BboxXYXY2XYWH": {}}, {"Permute": {}}]}}
    trainer = SimpleNamespace(cfg=cfg, input_norm=None, dataset=None)
    data = {"image": np.zeros((2, 3, 64, 96), np.float32),
            "gt_bbox": [np.array([[0.5, 0.5, 0.5, 0.5]]), np.array([[0.25, 0.25, 0.1, 0.1], [0.75, 0.5, 0.2, 0.2]])],
            "gt_class": [np.array([[0]]), np.array([[1], [2]])]}
    plots._draw_train_batch(trainer, data, ["a", "b", "c"], tmp_path / "train_batch0.jpg")
    first, second = drawn[0].boxes
    assert np.allclose(first[:, :5], [[0, 24, 16, 72, 48]])
    assert np.allclose(second[:, :5], [[1, 19.2, 12.8, 28.8, 19.2], [2, 62.4, 25.6, 81.6, 38.4]])
