"""YOLOv5 in ppdet's workspace: parameter counts, forward passes, and the loss on hand-made targets."""

from __future__ import annotations

import importlib
import math
import random
from pathlib import Path

import numpy as np
import pytest

import ppmulti.rank.models  # noqa: F401  registers the YOLOv5 modules (and imports ppdet quietly)
import paddle
from ppdet.core.workspace import create
from ppdet.modeling.layers import MultiClassNMS

from ppmulti.rank import config as config_mod
from ppmulti.rank.data.device import input_norm, to_model_input
from ppmulti.rank.models import YOLOv5Head, YOLOv5Loss, bbox_ciou, build_targets

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "configs" / "yolov5"

# YOLOv5 v6.0's published parameter counts (models/yolov5*.yaml, 80 classes; BN weight and bias
# included, running statistics not).
PUBLISHED_PARAMS = {"n": 1_872_157, "s": 7_235_389, "m": 21_190_557, "l": 46_563_709, "x": 86_749_405}
COCO_ANCHORS = [np.array(a, dtype=np.float32) for a in
                ([[10, 13], [16, 30], [33, 23]], [[30, 61], [62, 45], [59, 119]],
                 [[116, 90], [156, 198], [373, 326]])]
STRIDES = [8, 16, 32]


def _load(size: str, overrides: dict | None = None):
    # ppmulti.rank.config.load resets ppdet's module-level config before each load, so the sizes
    # do not inherit each other's depth/width.
    return config_mod.load(CONFIGS / f"yolov5_{size}_300e_coco.yml", overrides)


def _build(size: str, overrides: dict | None = None):
    cfg = _load(size, overrides)
    paddle.set_device("cpu")
    paddle.seed(0)
    return cfg, create(cfg.architecture)


def _trainable_params(model) -> int:
    return sum(int(np.prod(p.shape)) for p in model.parameters() if p.trainable)


def _batch(size: int = 128):
    """Two images; image 0 has two boxes, image 1 one box and a padding row."""
    rng = np.random.RandomState(0)
    gt_bbox = np.zeros((2, 2, 4), "float32")
    gt_class = np.zeros((2, 2, 1), "int32")
    pad = np.zeros((2, 2, 1), "float32")
    gt_bbox[0, 0], gt_class[0, 0], pad[0, 0] = [10, 12, 50, 70], 3, 1
    gt_bbox[0, 1], gt_class[0, 1], pad[0, 1] = [60, 30, 120, 90], 7, 1
    gt_bbox[1, 0], gt_class[1, 0], pad[1, 0] = [20, 20, 44, 40], 1, 1
    return {
        "image": paddle.to_tensor(rng.rand(2, 3, size, size).astype("float32")),
        "im_shape": paddle.to_tensor(np.full((2, 2), size, "float32")),
        "scale_factor": paddle.to_tensor(np.array([[1.0, 1.0], [0.5, 0.25]], "float32")),
        "gt_bbox": paddle.to_tensor(gt_bbox), "gt_class": paddle.to_tensor(gt_class),
        "pad_gt_mask": paddle.to_tensor(pad), "epoch_id": 0,
    }


# ---------------------------------------------------------------- configs and whole models

@pytest.mark.parametrize("size", list(PUBLISHED_PARAMS))
def test_parameter_count_matches_yolov5(size):
    cfg, model = _build(size)
    assert cfg["filename"] == f"yolov5_{size}_300e_coco"
    count = _trainable_params(model)
    published = PUBLISHED_PARAMS[size]
    assert abs(count - published) / published < 0.03, f"yolov5{size}: {count:,} vs {published:,}"


def test_model_uses_yolov5_batchnorm_and_bias_priors():
    _, model = _build("n")
    norms = [m for m in model.sublayers() if isinstance(m, paddle.nn.BatchNorm2D)]
    assert norms and all(m._epsilon == 1e-3 and m._momentum == 0.97 for m in norms)
    head = model.yolo_head
    for conv, stride in zip(head.convs, STRIDES):
        bias = conv.bias.numpy().reshape(3, 85)
        bound = 1 / math.sqrt(conv.weight.shape[1])  # PyTorch's default init, before the priors
        obj_prior = math.log(8 / (640 / stride) ** 2)
        cls_prior = math.log(0.6 / (80 - 0.99))
        assert np.all(np.abs(bias[:, 4] - obj_prior) <= bound + 1e-6)
        assert np.all(np.abs(bias[:, 5:] - cls_prior) <= bound + 1e-6)


def test_every_conv_block_uses_fused_silu_with_the_same_values():
    from ppdet.modeling.backbones.csp_darknet import BaseConv

    _, model = _build("n")
    blocks = [m for m in model.sublayers() if type(m) is BaseConv]
    assert blocks and all("forward" in m.__dict__ for m in blocks)   # backbone and neck alike
    model.eval()
    x = paddle.randn([1, 16, 8, 8])
    block = next(m for m in blocks if m.conv.weight.shape[1] == 16)
    y = block.bn(block.conv(x))
    np.testing.assert_allclose(block(x).numpy(), (y * paddle.nn.functional.sigmoid(y)).numpy(), atol=1e-6)


@pytest.mark.parametrize("size", ["n", "s"])
def test_forward_train_and_eval(size):
    # score_threshold 0 keeps every candidate, so decoding and NMS run on real boxes
    _, model = _build(size, {"YOLOv5Head": {"nms": {"score_threshold": 0.0, "keep_top_k": 50}}})
    model.train()
    out = model(_batch())
    assert {"loss", "loss_box", "loss_obj", "loss_cls"} <= set(out)
    for key in ("loss", "loss_box", "loss_obj", "loss_cls"):
        value = float(out[key].numpy().reshape(-1)[0])
        assert np.isfinite(value) and value > 0, key
    # the batch multiplier is ref_batch (64) by default
    parts = sum(float(out[k]) for k in ("loss_box", "loss_obj", "loss_cls"))
    assert float(out["loss"]) == pytest.approx(parts * 64, rel=1e-5)
    out["loss"].backward()
    assert all(p.grad is not None for p in model.parameters() if p.trainable)

    model.eval()
    with paddle.no_grad():
        out = model(_batch())
    bbox, bbox_num = out["bbox"].numpy(), out["bbox_num"].numpy()
    assert bbox.ndim == 2 and bbox.shape[1] == 6
    assert list(bbox_num.shape) == [2] and bbox_num.sum() == len(bbox) and bbox_num[0] == 50
    assert np.all((bbox[:, 0] >= 0) & (bbox[:, 0] < 80)) and np.all(bbox[:, 1] >= 0)


def test_default_nms_threshold_drops_untrained_scores():
    # YOLOv5's priors put obj * cls near 1e-5, below val.py's conf_thres 0.001: no boxes, right shapes
    _, model = _build("n")
    model.eval()
    with paddle.no_grad():
        out = model(_batch())
    assert out["bbox"].shape[-1] == 6 and list(out["bbox_num"].shape) == [2]


def _tiny_coco(root: Path) -> None:
    """Three images (one without boxes) and a COCO json, enough for the shipped reader."""
    import json

    import cv2

    (root / "images").mkdir(parents=True)
    images, annotations = [], []
    boxes = {1: [[10, 20, 40, 30], [60, 40, 30, 40]], 2: [[30, 30, 50, 25]], 3: []}
    for image_id, image_boxes in boxes.items():
        img = np.full((96, 128, 3), 60 + 40 * image_id, np.uint8)
        for n, (x, y, w, h) in enumerate(image_boxes):
            img[y:y + h, x:x + w] = 200
            annotations.append({"id": len(annotations) + 1, "image_id": image_id, "category_id": n + 1,
                                "bbox": [x, y, w, h], "area": w * h, "iscrowd": 0})
        cv2.imwrite(str(root / "images" / f"{image_id}.png"), img)
        images.append({"id": image_id, "file_name": f"{image_id}.png", "width": 128, "height": 96})
    coco = {"info": {}, "licenses": [], "images": images, "annotations": annotations,
            "categories": [{"id": 1, "name": "a"}, {"id": 2, "name": "b"}]}
    (root / "train.json").write_text(json.dumps(coco))


def test_shipped_reader_feeds_the_head(tmp_path):
    """The reader base file (YOLOv5Mosaic, HSV, flip, PadGT; 640 letterbox) gives what YOLOv5Head expects."""
    _tiny_coco(tmp_path / "data")
    # a user's config: the shipped model and reader, their own dataset sections
    dataset = (f"{{name: COCODataSet, dataset_dir: '{tmp_path / 'data'}', image_dir: images, "
               f"anno_path: train.json, allow_empty: true")
    path = tmp_path / "yolov5_n_tiny.yml"
    path.write_text(f"_BASE_: ['{CONFIGS / 'yolov5_n_300e_coco.yml'}']\n"
                    f"num_classes: 2\nworker_num: 0\n"
                    f"TrainDataset: {dataset}, data_fields: [image, gt_bbox, gt_class, is_crowd]}}\n"
                    f"EvalDataset: {dataset}}}\n")
    cfg = config_mod.load(path, {"TrainReader": {"batch_size": 2, "use_shared_memory": False},
                                 "EvalReader": {"batch_size": 2}})
    random.seed(0)  # YOLOv5Mosaic draws tiles and flips from `random`, centre, affine and HSV from numpy
    np.random.seed(0)
    data = next(iter(create("TrainReader")(create("TrainDataset")(), 0)))
    # a COCO dataset hands the mosaic its 5 records; the batch leaves as uint8 N x H x W x 3 ...
    assert list(data["image"].shape) == [2, 640, 640, 3] and data["image"].dtype == paddle.uint8
    data = to_model_input(data, input_norm(cfg))   # ... and the trainer makes the float input on the device
    assert list(data["image"].shape) == [2, 3, 640, 640] and data["image"].dtype == paddle.float32
    assert 0 <= float(data["image"].min()) and float(data["image"].max()) <= 1
    num = data["gt_bbox"].shape[1]
    assert list(data["gt_class"].shape) == [2, num, 1] and list(data["pad_gt_mask"].shape) == [2, num, 1]
    paddle.seed(0)
    model = create(cfg.architecture)
    model.train()
    out = model(data)
    assert np.isfinite(float(out["loss"])) and float(out["loss_box"]) > 0

    batch = next(iter(create("EvalReader")(create("EvalDataset")(), 0)))
    assert list(batch["image"].shape) == [2, 3, 640, 640]
    np.testing.assert_allclose(batch["scale_factor"].numpy(), 5.0)  # 128x96 letterboxed into 640x640
    model.eval()
    with paddle.no_grad():
        out = model(batch)
    assert out["bbox"].shape[-1] == 6 and list(out["bbox_num"].shape) == [2]


def test_export_to_static_graph(tmp_path):
    """ppdet's export path: to_static with a fixed image size, save, load, run (im_shape is pruned)."""
    from paddle.static import InputSpec

    _, model = _build("n")
    model.eval()
    spec = [{"image": InputSpec([None, 3, 128, 128], name="image"),
             "scale_factor": InputSpec([None, 2], name="scale_factor")}]
    paddle.jit.save(paddle.jit.to_static(model, input_spec=spec), str(tmp_path / "model"))
    loaded = paddle.jit.load(str(tmp_path / "model"))
    bbox, bbox_num = loaded(paddle.rand([1, 3, 128, 128]), paddle.to_tensor([[1.0, 1.0]]))
    assert bbox.shape[-1] == 6 and list(bbox_num.shape) == [1]


# ---------------------------------------------------------------- target assignment

def _targets_for(box_xyxy, image_size=640):
    grids = [(image_size // s, image_size // s) for s in STRIDES]
    gt = np.array([[box_xyxy]], "float32")
    return build_targets(gt, np.array([[[5]]]), np.ones((1, 1, 1)), COCO_ANCHORS, STRIDES, grids)


def test_anchor_matching_uses_the_size_ratio_threshold():
    # a 40x40 px box: P3 anchor 10x13 has ratio exactly 4.0 (not < 4, no match); P5 anchors
    # 156x198 and 373x326 are more than 4x too large
    levels = _targets_for([78, 86, 118, 126])
    assert [sorted(set(t.anchor.tolist())) for t in levels] == [[1, 2], [0, 1, 2], [0]]
    for t in levels:
        assert np.all(t.cls == 5) and np.all(t.image == 0)


def test_neighbour_cells_follow_the_half_cell_rule():
    levels = _targets_for([78, 86, 118, 126])  # centre (98, 106) px
    cells = [sorted(set(zip(t.gi.tolist(), t.gj.tolist()))) for t in levels]
    # P3: centre (12.25, 13.25) -> own cell, left and up; P4: (6.125, 6.625) -> own, left, down;
    # P5: (3.0625, 3.3125) -> own, left, up
    assert cells[0] == [(11, 13), (12, 12), (12, 13)]
    assert cells[1] == [(5, 6), (6, 6), (6, 7)]
    assert cells[2] == [(2, 3), (3, 2), (3, 3)]
    p3 = levels[0]
    assert len(p3) == 2 * 3  # two anchors x three cells
    # box targets are relative to the responsible cell's corner (range -0.5..1.5), w/h in grid units
    by_cell = {(gi, gj): box for gi, gj, box in zip(p3.gi.tolist(), p3.gj.tolist(), p3.box)}
    np.testing.assert_allclose(by_cell[(12, 13)], [0.25, 0.25, 5, 5])
    np.testing.assert_allclose(by_cell[(11, 13)], [1.25, 0.25, 5, 5])
    np.testing.assert_allclose(by_cell[(12, 12)], [0.25, 1.25, 5, 5])
    np.testing.assert_allclose(p3.anchor_wh[p3.anchor == 1][0], [16 / 8, 30 / 8])


def test_no_neighbour_beyond_the_image_edge():
    # centre (3, 3) px is in the first P3 cell: no left/up neighbour even though it is near that edge
    p3 = _targets_for([1, 1, 5, 5])[0]
    assert p3.anchor.tolist() == [0] and (p3.gi.tolist(), p3.gj.tolist()) == ([0], [0])


def test_padding_rows_and_degenerate_boxes_are_ignored():
    gt = np.array([[[78, 86, 118, 126], [0, 0, 0, 0], [10, 10, 10, 40]]], "float32")
    valid = np.array([[[1], [0], [1]]], "float32")  # third row: zero width, never matches
    levels = build_targets(gt, np.zeros((1, 3, 1)), valid, COCO_ANCHORS, STRIDES, [(80, 80), (40, 40), (20, 20)])
    single = _targets_for([78, 86, 118, 126])
    assert [len(t) for t in levels] == [len(t) for t in single]


# ---------------------------------------------------------------- CIoU

def _ciou(a, b) -> float:
    return float(bbox_ciou(paddle.to_tensor([a], "float32"), paddle.to_tensor([b], "float32"))[0])


def test_ciou_of_identical_boxes_is_one():
    assert _ciou([5, 7, 4, 2], [5, 7, 4, 2]) == pytest.approx(1.0, abs=1e-6)


def test_ciou_hand_computed_cases():
    # same shape, shifted by (1, 1): IoU 1/7, enclosing diagonal^2 18, centre distance^2 2
    assert _ciou([1, 1, 2, 2], [2, 2, 2, 2]) == pytest.approx(1 / 7 - 2 / 18, abs=1e-6)
    # same centre, 2x1 vs 1x2: IoU 1/3, no distance term, aspect term v * alpha
    v = 4 / math.pi ** 2 * (math.atan(1 / 2) - math.atan(2 / 1)) ** 2
    alpha = v / (v - 1 / 3 + 1)
    assert _ciou([0, 0, 2, 1], [0, 0, 1, 2]) == pytest.approx(1 / 3 - v * alpha, abs=1e-6)


# ---------------------------------------------------------------- the loss

def _head(num_classes: int = 4, **loss_kwargs) -> YOLOv5Head:
    paddle.seed(0)
    loss = YOLOv5Loss(num_classes=num_classes, **loss_kwargs)
    nms = MultiClassNMS(score_threshold=0.0, nms_top_k=100, keep_top_k=10, nms_threshold=0.6)
    return YOLOv5Head(in_channels=[8, 8, 8], num_classes=num_classes, loss=loss, nms=nms)


def _zero_outputs(head: YOLOv5Head, batch: int, size: int):
    return [paddle.zeros([batch, head.num_anchors * head.num_outputs, size // s, size // s])
            for s in STRIDES]


def _targets(gt_bbox, gt_class, mask):
    return {"gt_bbox": paddle.to_tensor(np.asarray(gt_bbox, "float32")),
            "gt_class": paddle.to_tensor(np.asarray(gt_class, "int32")),
            "pad_gt_mask": paddle.to_tensor(np.asarray(mask, "float32"))}


def test_zero_gt_batch_gives_only_objectness_loss():
    head = _head()
    outs = _zero_outputs(head, 2, 64)
    for targets in (_targets(np.zeros((2, 0, 4)), np.zeros((2, 0, 1)), np.zeros((2, 0, 1))),
                    _targets(np.ones((2, 3, 4)), np.ones((2, 3, 1)), np.zeros((2, 3, 1)))):
        out = head.loss(outs, targets, head.anchors, head.strides)
        assert float(out["loss_box"]) == 0 and float(out["loss_cls"]) == 0
        # every prediction is sigmoid(0) = 0.5 against target 0: BCE = log 2 per level
        expected = math.log(2) * (4.0 + 1.0 + 0.4) * 1.0
        assert float(out["loss_obj"]) == pytest.approx(expected, rel=1e-5)
        assert float(out["loss"]) == pytest.approx(expected * 64, rel=1e-5)


def _logit(p):
    return math.log(p / (1 - p))


def test_perfect_prediction_has_no_box_loss_and_decodes_to_the_gt():
    """Set the logits so every responsible prediction equals its target: CIoU 1, and decoding gives the gt."""
    head = _head()
    size, box = 64, [14.0, 18.0, 34.0, 42.0]  # 20x24 px, centre (24, 30)
    outs = _zero_outputs(head, 1, size)
    outs = [o.numpy() for o in outs]
    levels = build_targets(np.array([[box]]), np.array([[[2]]]), np.ones((1, 1, 1)),
                           head.anchors, head.strides, [o.shape[2:] for o in outs])
    no = head.num_outputs
    for out, t in zip(outs, levels):
        for a, gj, gi, (x, y, w, h), anchor in zip(t.anchor, t.gj, t.gi, t.box, t.anchor_wh):
            ch = a * no
            out[0, ch + 0, gj, gi] = _logit((x + 0.5) / 2)
            out[0, ch + 1, gj, gi] = _logit((y + 0.5) / 2)
            out[0, ch + 2, gj, gi] = _logit(math.sqrt(w / anchor[0]) / 2)
            out[0, ch + 3, gj, gi] = _logit(math.sqrt(h / anchor[1]) / 2)
            out[0, ch + 4, gj, gi] = 8.0
            out[0, ch + 5 + 2, gj, gi] = 8.0
    assert sum(len(t) for t in levels) > 3
    outs = [paddle.to_tensor(o) for o in outs]
    loss = head.loss(outs, _targets([[box]], [[[2]]], [[[1]]]), head.anchors, head.strides)
    assert float(loss["loss_box"]) == pytest.approx(0.0, abs=1e-5)

    boxes, scores = head.decode(outs)
    best = int(np.argmax(scores.numpy()[0, :, 2]))
    np.testing.assert_allclose(boxes.numpy()[0, best], box, atol=1e-3)
    # post_process maps back to the original image: scale_factor is (y, x)
    bbox, bbox_num, _ = head.post_process(outs, paddle.to_tensor([[2.0, 0.5]]))
    top = bbox.numpy()[np.argmax(bbox.numpy()[:, 1])]
    assert int(top[0]) == 2 and int(bbox_num[0]) == len(bbox)
    np.testing.assert_allclose(top[2:], [box[0] / 0.5, box[1] / 2, box[2] / 0.5, box[3] / 2], atol=1e-2)


def test_loss_weights_follow_yolov5_scaling():
    loss = YOLOv5Loss(num_classes=20, img_size=320)
    assert loss.box_weight == pytest.approx(0.05)
    assert loss.cls_weight == pytest.approx(0.5 * 20 / 80)
    assert loss.obj_weight == pytest.approx(1.0 * (320 / 640) ** 2)
    smooth = YOLOv5Loss(label_smoothing=0.1)
    assert (smooth.cls_pos, smooth.cls_neg) == pytest.approx((0.95, 0.05))


def test_batch_scale_modes():
    head = _head()
    outs = _zero_outputs(head, 2, 64)
    targets = _targets([[[10, 10, 30, 40]], [[5, 5, 60, 50]]], [[[1]], [[3]]], [[[1]], [[1]]])
    ref = head.loss(outs, targets, head.anchors, head.strides)
    literal = YOLOv5Loss(num_classes=4, batch_scale="batch")(outs, targets, head.anchors, head.strides)
    assert float(literal["loss"]) == pytest.approx(float(ref["loss"]) * 2 / 64, rel=1e-5)
    with pytest.raises(ValueError, match="batch_scale"):
        YOLOv5Loss(batch_scale="sum")


# ---------------------------------------------------------------- registration

def test_registration_is_idempotent():
    from ppdet.core.workspace import global_config

    from ppmulti.rank.models import yolov5

    for name in ("yolov5", "yolov5_head", "yolov5_loss"):
        importlib.reload(importlib.import_module(f"ppmulti.rank.models.{name}"))
    for name in ("YOLOv5CSPDarkNet", "YOLOv5CSPPAN", "YOLOv5Head", "YOLOv5Loss"):
        assert name in global_config

    class YOLOv3Head:  # a name ppdet already owns
        pass

    with pytest.raises(ValueError, match="already registered"):
        yolov5.register_once(YOLOv3Head)
