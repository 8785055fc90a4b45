"""The Paddle-3 fixes in the version seam: failing unfixed and right fixed on Paddle 3; not applied on 2.6."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import paddle
import pytest

from ppmulti.rank import compat

compat.import_ppdet()   # what every rank does: on Paddle 3 this applies the fixes

from ppdet.modeling import ops  # noqa: E402  (after import_ppdet: its numba notice, the fixes)
from ppdet.modeling.assigners.atss_assigner import ATSSAssigner  # noqa: E402
from ppdet.modeling.assigners.task_aligned_assigner import TaskAlignedAssigner  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
PADDLE3 = compat.paddle3()


def _numpy_refuses_1d_scalars() -> bool:
    """Whether this numpy refuses ``int()`` of a 1-element 1-D array (TypeError "only 0-dimensional arrays"):
    numpy 2.4 and 2.5 here do; 1.26 and 2.2 (the newest for Python 3.10) only warn. ppdet 2.6.0's shape-[1]
    scalars fail through it on Paddle 3."""
    try:
        int(np.zeros([1], dtype="int64"))
    except TypeError:
        return True
    return False


NUMPY_REFUSES_1D = _numpy_refuses_1d_scalars()


def _original(func):
    """ppdet's own callable behind our fix's wrapper (ppdet's registry refuses a module reload)."""
    while compat.is_ppdet_fix(func):
        func = func.__wrapped__
    return func


@pytest.fixture
def unfixed(monkeypatch):
    """ppdet as it is without the seam's fixes, for one test; the fixed state comes back afterwards."""
    for owner, attr in ((TaskAlignedAssigner, "forward"), (ATSSAssigner, "forward"), (ops, "multiclass_nms")):
        monkeypatch.setattr(owner, attr, _original(getattr(owner, attr)))
    return {"tal": TaskAlignedAssigner.forward, "atss": ATSSAssigner.forward, "nms": ops.multiclass_nms}


def test_fixes_are_applied_on_paddle3_only():
    fixed = [compat.is_ppdet_fix(f) for f in (TaskAlignedAssigner.forward, ATSSAssigner.forward, ops.multiclass_nms)]
    assert fixed == [PADDLE3] * 3
    assert compat.apply_ppdet_fixes() == []   # idempotent: import_ppdet applied them already (or none are due)


def test_nothing_is_applied_to_an_unfixed_ppdet_on_paddle2(unfixed, monkeypatch):
    monkeypatch.setattr(compat, "installed_version", lambda dist="paddle": (2, 6, 2))
    assert compat.apply_ppdet_fixes() == []
    assert (TaskAlignedAssigner.forward, ATSSAssigner.forward, ops.multiclass_nms) == (
        unfixed["tal"], unfixed["atss"], unfixed["nms"])


# ---------------------------------------------------------------- F1, F2: the assigners and int32 labels

def _assign_inputs() -> dict:
    """Two images, three boxes each (one padded), anchors of a 128 px input at strides 8/16/32."""
    from ppdet.modeling.assigners.utils import generate_anchors_for_grid_cell

    rng = np.random.default_rng(0)
    batch, boxes, classes = 2, 3, 3
    feats = [paddle.zeros([batch, 8, s, s]) for s in (16, 8, 4)]
    anchors, points, nums, _ = generate_anchors_for_grid_cell(feats, [8, 16, 32], 5.0, 0.5)
    n = points.shape[0]
    xy, wh = rng.uniform(0, 90, (batch, boxes, 2)), rng.uniform(12, 36, (batch, boxes, 2))
    pad = np.ones((batch, boxes, 1), "float32")
    pad[1, 2] = 0
    pxy, pwh = rng.uniform(0, 110, (batch, n, 2)), rng.uniform(4, 24, (batch, n, 2))
    return {"anchors": anchors, "points": points, "nums": nums, "classes": classes,
            "gt_bboxes": paddle.to_tensor(np.concatenate([xy, xy + wh], -1).astype("float32")),
            "labels": rng.integers(0, classes, (batch, boxes, 1)), "pad": paddle.to_tensor(pad),
            "scores": paddle.to_tensor(rng.uniform(0, 1, (batch, n, classes)).astype("float32")),
            "bboxes": paddle.to_tensor(np.concatenate([pxy, pxy + pwh], -1).astype("float32"))}


def _assign(kind: str, x: dict, dtype: str):
    labels = paddle.to_tensor(x["labels"].astype(dtype))
    if kind == "tal":
        return TaskAlignedAssigner(topk=13)(x["scores"], x["bboxes"], x["points"], x["nums"], labels,
                                            x["gt_bboxes"], x["pad"], x["classes"])
    return ATSSAssigner(topk=9)(x["anchors"], x["nums"], labels, x["gt_bboxes"], x["pad"], x["classes"],
                                pred_bboxes=x["bboxes"])


def _assert_same(got, want) -> None:
    assert got[0].dtype == paddle.int32          # int32 labels in, int32 assigned labels out, as on Paddle 2.6
    for g, w in zip(got[:3], want[:3]):
        np.testing.assert_array_equal(g.numpy(), w.numpy().astype(g.numpy().dtype))


@pytest.mark.parametrize("kind,cls", [("tal", TaskAlignedAssigner), ("atss", ATSSAssigner)], ids=["tal", "atss"])
def test_assigner_takes_ppdets_int32_labels(kind, cls, unfixed):
    x = _assign_inputs()
    want = _assign(kind, x, "int64")             # one integer dtype throughout: fine on every Paddle
    if PADDLE3:
        with pytest.raises(TypeError, match="Type promotion only support"):
            _assign(kind, x, "int32")              # F1/F2: what ppdet's data pipeline gives it
        assert f"{cls.__name__}.forward" in compat.apply_ppdet_fixes()
    else:
        _assert_same(_assign(kind, x, "int32"), want)   # Paddle 2.6 promotes int32 + int64 itself
        assert compat.apply_ppdet_fixes() == [] and cls.forward is unfixed[kind]
        compat.fix_assigner_int32_labels()         # the fix, where it is not due, changes no result either
    _assert_same(_assign(kind, x, "int32"), want)
    assert compat.fix_assigner_int32_labels() == []   # idempotent: no second wrapper
    assert cls.forward.__wrapped__ is unfixed[kind]


# ---------------------------------------------------------------- F3 + F4 + F6: export, program file, predictor

class _NMSNet(paddle.nn.Layer):
    """Just ppdet's MultiClassNMS, as a detector's head ends."""

    def __init__(self):
        super().__init__()
        from ppdet.modeling.layers import MultiClassNMS

        self.nms = MultiClassNMS(score_threshold=0.05, nms_top_k=100, keep_top_k=20, nms_threshold=0.5)
        # one weight, so that the export writes model.pdiparams as a detector's does
        self.scale = self.create_parameter([1], default_initializer=paddle.nn.initializer.Constant(1.0))

    def forward(self, boxes, scores):
        out, num, _ = self.nms(boxes * self.scale, scores)
        return out, num


class _UpNet(paddle.nn.Layer):
    """A conv and a nearest upsampling, as the necks have."""

    def __init__(self):
        super().__init__()
        self.conv = paddle.nn.Conv2D(3, 4, 3, padding=1)

    def forward(self, x):
        return paddle.nn.functional.interpolate(self.conv(x), scale_factor=2.0, mode="nearest")


def _export(net: paddle.nn.Layer, spec: list, path: Path) -> None:
    net.eval()
    with compat.full_graph_to_static():   # ppdet's exporter's mode
        paddle.jit.save(paddle.jit.to_static(net, input_spec=spec), str(path / "model"))


def _predict(config, feeds: dict) -> np.ndarray:
    import paddle.inference

    predictor = paddle.inference.create_predictor(config)
    for name, value in feeds.items():
        predictor.get_input_handle(name).copy_from_cpu(value)
    predictor.run()
    return predictor.get_output_handle(predictor.get_output_names()[0]).copy_to_cpu()


def _nms_inputs() -> dict:
    rng = np.random.default_rng(0)
    xy = rng.uniform(0, 100, (1, 50, 2)).astype("float32")
    return {"boxes": np.concatenate([xy, xy + rng.uniform(5, 30, (1, 50, 2)).astype("float32")], -1),
            "scores": rng.uniform(0, 1, (1, 3, 50)).astype("float32")}


def test_multiclass_nms_exports_and_the_predictor_loads_it(tmp_path, unfixed):
    spec = [paddle.static.InputSpec([1, 50, 4], "float32", "boxes"),
            paddle.static.InputSpec([1, 3, 50], "float32", "scores")]
    if PADDLE3:
        with pytest.raises(TypeError, match="multiclass_nms3"):
            _export(_NMSNet(), spec, tmp_path)   # F3: ppdet's old-IR op builder in a PIR program
        assert "ops.multiclass_nms" in compat.apply_ppdet_fixes()
    else:
        assert compat.apply_ppdet_fixes() == [] and ops.multiclass_nms is unfixed["nms"]
    out = tmp_path / "out"
    out.mkdir()
    net = _NMSNet()
    _export(net, spec, out)
    # F4: the program file is named by the Paddle version, and only that one is written
    assert (out / compat.exported_program_name()).is_file() and (out / "model.pdiparams").is_file()
    assert not (out / ("model.pdmodel" if PADDLE3 else "model.json")).exists()
    feeds = _nms_inputs()
    got = _predict(compat.cpu_predictor_config(out), feeds)
    want = net(*(paddle.to_tensor(v) for v in feeds.values()))[0].numpy()   # dygraph: ppdet's own path
    assert len(want) > 0
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_exported_program_name_by_version():
    assert compat.exported_program_name((2, 6, 2)) == "model.pdmodel"
    assert compat.exported_program_name((3, 3, 1)) == "model.json"
    assert compat.exported_program_name() == ("model.json" if PADDLE3 else "model.pdmodel")


def test_cpu_predictor_runs_nearest_upsampling(tmp_path):
    """F6, Paddle issue #79749: Paddle 3.3's CPU predictor with oneDNN on cannot run ``nearest_interp``."""
    import paddle.inference

    net = _UpNet()
    _export(net, [paddle.static.InputSpec([1, 3, 8, 8], "float32", "x")], tmp_path)
    x = np.random.default_rng(0).uniform(-1, 1, (1, 3, 8, 8)).astype("float32")
    want = net(paddle.to_tensor(x)).numpy()
    default = paddle.inference.Config(str(tmp_path / compat.exported_program_name()),
                                      str(tmp_path / "model.pdiparams"))
    default.disable_gpu()
    default.enable_mkldnn()   # the CPU default, said out loud
    if compat.installed_version()[:2] == (3, 3):   # the Paddle the bug was seen on
        with pytest.raises(Exception, match="ConvertPirAttribute2RuntimeAttribute"):
            _predict(default, {"x": x})
    else:
        np.testing.assert_allclose(_predict(default, {"x": x}), want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(_predict(compat.cpu_predictor_config(tmp_path), {"x": x}), want, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------- F5: numpy 2 and the YOLOv5 loss parts

def test_yolov5_loss_parts_are_0d_so_float_works():
    from ppmulti.rank.models.yolov5_head import YOLOv5Head
    from ppmulti.rank.models.yolov5_loss import YOLOv5Loss

    one = paddle.zeros([1])                       # the loss parts' old start value
    if NUMPY_REFUSES_1D:
        with pytest.raises(TypeError, match="0-dimensional"):
            float(one)                            # F5: numpy >= 2.4 refuses a 1-element 1-D array
    else:
        assert float(one) == 0.0                  # numpy 1.26 and 2.2 still convert it
    paddle.seed(0)
    head = YOLOv5Head(in_channels=[8, 8, 8], num_classes=4, loss=YOLOv5Loss(num_classes=4))
    outs = [paddle.randn([2, head.num_anchors * head.num_outputs, 64 // s, 64 // s]) for s in (8, 16, 32)]
    targets = {"gt_bbox": paddle.to_tensor([[[8, 8, 40, 40], [0, 0, 0, 0]]] * 2, dtype="float32"),
               "gt_class": paddle.to_tensor([[[1], [0]]] * 2, dtype="int32"),
               "pad_gt_mask": paddle.to_tensor([[[1], [0]]] * 2, dtype="float32")}
    out = head.loss(outs, targets, head.anchors, head.strides)
    for key in ("loss", "loss_box", "loss_obj", "loss_cls"):
        assert out[key].shape == [] and np.isfinite(float(out[key])) and float(out[key]) > 0, key
    out["loss"].backward()


# ---------------------------------------------------------------- F7, F8: two-stage detectors and 0-D tensors

def _zero_dim_modules() -> list:
    import importlib

    return [importlib.import_module(name) for name in compat.ZERO_DIM_MODULES]


@pytest.fixture
def unfixed_0d(monkeypatch):
    """ppdet's modules without F7 (their own ``paddle``) and RPNHead without F8, for one test."""
    from ppdet.modeling.proposal_generator.rpn_head import RPNHead

    for module in _zero_dim_modules():
        monkeypatch.setattr(module, "paddle", getattr(module.paddle, "__wrapped__", module.paddle))
    monkeypatch.setattr(RPNHead, "_gen_proposal", _original(RPNHead._gen_proposal))
    return RPNHead._gen_proposal


def test_zero_dim_fixes_are_due_from_paddle_2_5(unfixed, unfixed_0d, monkeypatch):
    from ppdet.modeling.losses.ssd_loss import SSDLoss
    from ppdet.modeling.proposal_generator.rpn_head import RPNHead

    from ppdet.modeling.losses import gfocal_loss

    monkeypatch.setattr(SSDLoss, "_mine_hard_example", _original(SSDLoss._mine_hard_example))
    monkeypatch.setattr(gfocal_loss, "quality_focal_loss", _original(gfocal_loss.quality_focal_loss))
    from ppdet.modeling.transformers.deformable_transformer import MSDeformableAttention

    monkeypatch.setattr(MSDeformableAttention, "forward", _original(MSDeformableAttention.forward))
    from ppdet.modeling import ops

    for name in ("prior_box", "matrix_nms"):   # F16, applied at import on Paddle 3
        monkeypatch.setattr(ops, name, _original(getattr(ops, name)))
    from ppdet.modeling.transformers import dino_transformer, utils

    for owner in (utils, dino_transformer):
        monkeypatch.setattr(owner, "get_contrastive_denoising_training_group",
                            _original(owner.get_contrastive_denoising_training_group))

    monkeypatch.setattr(compat, "installed_version", lambda dist="paddle": (2, 4, 2))   # ppdet 2.6.0's own Paddle
    assert compat.apply_ppdet_fixes() == []
    monkeypatch.setattr(compat, "installed_version", lambda dist="paddle": (2, 6, 2))
    assert compat.apply_ppdet_fixes() == [f"{n.rsplit('.', 1)[-1]}.paddle.concat" for n in compat.ZERO_DIM_MODULES]
    assert RPNHead._gen_proposal is unfixed_0d       # F8 is Paddle 3's
    assert compat.apply_ppdet_fixes() == []          # idempotent
    assert compat.fix_concat_of_0d_shapes() == []
    monkeypatch.setattr(compat, "installed_version", lambda dist="paddle": (3, 3, 1))
    assert compat.apply_ppdet_fixes() == ["TaskAlignedAssigner.forward", "ATSSAssigner.forward", "ops.multiclass_nms",
                                          "RPNHead._gen_proposal", "SSDLoss._mine_hard_example",
                                          "gfocal_loss.quality_focal_loss", "MSDeformableAttention.forward",
                                          "get_contrastive_denoising_training_group", "ops.prior_box",
                                          "ops.matrix_nms"]
    assert RPNHead._gen_proposal.__wrapped__ is unfixed_0d


def test_concat_takes_0d_tensors_as_one_element():
    a, b = paddle.to_tensor([3, 4]), paddle.to_tensor([7, 8, 9])[1]   # 1-D and 0-D, as ppdet mixes them
    assert b.shape == []
    np.testing.assert_array_equal(compat.concat_0d_as_1d([a, b]).numpy(), [3, 4, 8])
    np.testing.assert_array_equal(compat.concat_0d_as_1d([b, b]).numpy(), [8, 8])
    m = paddle.ones([2, 2])
    assert compat.concat_0d_as_1d([m, m], axis=1).shape == [2, 4]   # anything else is paddle.concat's
    with pytest.raises(ValueError, match="axis is expected"):
        paddle.concat([b, b])                        # what Paddle 2.6 and 3 do with it


def _rpn_proposals(head):
    """Two images' proposals from an RPNHead in eval mode on two FPN levels of a 64x96 input."""
    paddle.seed(0)
    feats = [paddle.randn([2, 8, 64 // s, 96 // s]) for s in (8, 16)]
    inputs = {"im_shape": paddle.to_tensor([[64.0, 96.0], [64.0, 80.0]])}
    head.eval()
    rois, rois_num, _ = head(feats, inputs)
    return rois, rois_num


def _rpn_head():
    from ppdet.modeling.proposal_generator.rpn_head import RPNHead

    paddle.seed(0)
    return RPNHead(anchor_generator={"aspect_ratios": [0.5, 1.0, 2.0], "anchor_sizes": [[16], [32]],
                                     "strides": [8, 16]},
                   test_proposal={"pre_nms_top_n": 200, "post_nms_top_n": 50}, in_channel=8)


def test_rpn_proposals_for_a_batch(unfixed_0d):
    """F7 + F8: Faster/Cascade R-CNN's RPN on a batch of two (ppdet's ``RPNHead._gen_proposal``)."""
    head = _rpn_head()
    f8_due = PADDLE3 and NUMPY_REFUSES_1D
    with pytest.raises(TypeError if f8_due else ValueError,
                       match="0-dimensional arrays" if f8_due else "axis is expected"):
        _rpn_proposals(head)       # F8 on Paddle 3 with numpy >= 2.4, then F7 on Paddle 2.6 and 3
    compat.fix_concat_of_0d_shapes()
    if f8_due:
        with pytest.raises(TypeError, match="0-dimensional arrays"):
            _rpn_proposals(head)   # F7 alone is not enough on Paddle 3 with numpy >= 2.4
    # F8 is applied on every Paddle 3 (harmless where numpy still converts a shape-[1] tensor)
    assert compat.apply_ppdet_fixes() == (["RPNHead._gen_proposal"] if PADDLE3 else [])
    rois, rois_num = _rpn_proposals(head)
    assert len(rois) == 2 and rois_num.shape == [2]
    assert [int(n) for n in rois_num.numpy()] == [r.shape[0] for r in rois]
    assert all(0 < r.shape[0] <= 50 for r in rois)
    for r, (h, w) in zip(rois, ((64, 96), (64, 80))):   # proposals are clipped to each image
        box = r.numpy()
        assert box.min() >= 0 and box[:, [0, 2]].max() <= w and box[:, [1, 3]].max() <= h
    with compat.one_element_tensor_index():
        assert list(range(paddle.to_tensor([3]))) == [0, 1, 2]
    assert list(range(paddle.to_tensor(3))) == [0, 1, 2]   # a 0-D tensor indexes everywhere


def test_rcnn_predictions_scale_back_to_the_image(unfixed_0d):
    """F7 in evaluation: ppdet's ``BBoxPostProcess.get_pred``, after every two-stage detector's NMS."""
    from ppdet.modeling.post_process import BBoxPostProcess

    post = BBoxPostProcess(num_classes=3)
    rng = np.random.default_rng(0)
    xy = rng.uniform(0, 60, (5, 2))
    boxes = np.concatenate([rng.integers(0, 3, (5, 1)), rng.uniform(0.1, 1, (5, 1)), xy, xy + 20], 1)
    bbox_num = np.array([3, 2], "int32")
    scale = np.array([[2.0, 1.5], [1.0, 0.5]], "float32")            # scale_y, scale_x per image
    args = (paddle.to_tensor(boxes.astype("float32")), paddle.to_tensor(bbox_num),
            paddle.to_tensor([[96.0, 96.0], [96.0, 96.0]]), paddle.to_tensor(scale))
    with pytest.raises(ValueError, match="axis is expected"):
        post.get_pred(*args)                                           # both stacks, unfixed
    compat.fix_concat_of_0d_shapes()
    _, pred, num = post.get_pred(*args)
    np.testing.assert_array_equal(num.numpy(), bbox_num)
    per_box = np.repeat(scale, bbox_num, axis=0)[:, [1, 0, 1, 0]]      # x by scale_x, y by scale_y
    want = np.concatenate([boxes[:, :2], boxes[:, 2:] / per_box], 1)
    np.testing.assert_allclose(pred.numpy(), want, rtol=1e-5)


# ---------------------------------------------------------------- F9: SSD's hard example mining

def test_ssd_mines_hard_negatives(monkeypatch):
    from ppdet.modeling.losses.ssd_loss import SSDLoss

    monkeypatch.setattr(SSDLoss, "_mine_hard_example", _original(SSDLoss._mine_hard_example))
    rng = np.random.default_rng(0)
    batch, anchors, bg = 3, 40, 3
    labels = np.full((batch, anchors), bg, "int64")
    labels[0, [2, 7]] = 1                            # two positives: 6 negatives kept
    labels[1, [0, 5, 9, 30]] = [0, 2, 2, 1]           # four: 12
    loss = rng.uniform(0.1, 5, (batch, anchors)).astype("float32")   # image 2 has none: int(0.01 x 40) = 0
    want = labels != bg
    for i, keep in enumerate((6, 12, 0)):
        negatives = np.where(labels[i] == bg, loss[i], 0)
        want[i, np.argsort(-negatives, kind="stable")[:keep]] = True
    ssd = SSDLoss()
    args = (paddle.to_tensor(loss), paddle.to_tensor(labels), bg)
    if PADDLE3:
        with pytest.raises(TypeError, match="Type promotion"):
            ssd._mine_hard_example(*args)            # int64 ranks < float32 counts
        assert compat.apply_ppdet_fixes() == ["SSDLoss._mine_hard_example"]
    else:
        np.testing.assert_array_equal(ssd._mine_hard_example(*args).numpy(), want)   # ppdet's own, on Paddle 2.6
        assert compat.apply_ppdet_fixes() == []
        compat.fix_ssd_hard_example_mining()
    np.testing.assert_array_equal(ssd._mine_hard_example(*args).numpy(), want)
    assert compat.fix_ssd_hard_example_mining() == []


# ---------------------------------------------------------------- F10: FCOS's targets and numpy 2.4

def test_fcos_targets_with_numpy_without_newshape(monkeypatch):
    import inspect

    from ppdet.data.transform import batch_operators
    from ppdet.data.transform.batch_operators import Gt2FCOSTarget

    monkeypatch.setattr(batch_operators, "np", getattr(batch_operators.np, "__wrapped__", batch_operators.np))
    removed = "newshape" not in inspect.signature(np.reshape).parameters   # numpy 2.4 (the Paddle 3 stack's)
    op = Gt2FCOSTarget(object_sizes_boundary=[64, 128], center_sampling_radius=1.5, downsample_ratios=[8, 16, 32],
                       norm_reg_targets=True)

    def batch():   # one 64x64 image, one box of class 2 centred at (28, 36)
        return [{"image": np.zeros((3, 64, 64), "float32"), "gt_bbox": np.array([[12, 20, 44, 52]], "float32"),
                 "gt_class": np.array([[2]], "int32")}]

    if removed:
        with pytest.raises(TypeError, match="newshape"):
            op(batch())
        assert compat.apply_ppdet_fixes() == ["batch_operators.np.reshape"]
    else:
        assert compat.fix_numpy_reshape_newshape() == []   # not due: numpy still takes the keyword
    out = op(batch())[0]
    labels = out["labels0"]                          # stride 8: an 8x8 grid, one label per cell
    assert labels.shape == (8, 8, 1) and out["reg_target0"].shape == (8, 8, 4) and out["centerness0"].shape == (8, 8, 1)
    cells = {(int(y), int(x)) for y, x, _ in np.argwhere(labels > 0)}
    assert (4, 3) in cells and set(labels[labels > 0].tolist()) == {3}   # class 2 + 1 at the box centre's cell
    assert all(1 <= x <= 5 and 2 <= y <= 6 for y, x in cells)            # centre sampling: within the box
    assert compat.fix_numpy_reshape_newshape() == []


# ---------------------------------------------------------------- F11: GFL's quality focal loss

def _qfl_reference(pred, label, score, beta=2.0):
    """The quality focal loss in numpy (Li et al. 2020, as ppdet's gfocal_loss.py computes it), per anchor."""
    prob = 1 / (1 + np.exp(-pred))

    def bce(x, y):
        return np.maximum(x, 0) - x * y + np.log1p(np.exp(-np.abs(x)))

    loss = bce(pred, 0.0) * prob ** beta
    for i, c in enumerate(label):
        if 0 <= c < pred.shape[1]:
            loss[i, c] = bce(pred[i, c], score[i]) * abs(score[i] - prob[i, c]) ** beta
    return loss.sum(1)


def test_quality_focal_loss_with_positives(monkeypatch):
    from ppdet.modeling.losses import gfocal_loss

    monkeypatch.setattr(gfocal_loss, "quality_focal_loss", _original(gfocal_loss.quality_focal_loss))
    rng = np.random.default_rng(0)
    pred = rng.normal(0, 2, (6, 3)).astype("float32")
    label = np.array([0, 3, 2, 3, 1, 3], "int64")     # 3 is the background
    score = rng.uniform(0, 1, 6).astype("float32")
    want = _qfl_reference(pred, label, score)

    def qfl():
        return gfocal_loss.quality_focal_loss(paddle.to_tensor(pred), (paddle.to_tensor(label),
                                                                       paddle.to_tensor(score))).numpy()
    if PADDLE3:
        with pytest.raises(TypeError, match="Type promotion"):
            qfl()                                     # float32 loss x bool mask
        assert compat.apply_ppdet_fixes() == ["gfocal_loss.quality_focal_loss"]
    else:
        np.testing.assert_allclose(qfl(), want, rtol=1e-5)   # ppdet's own on Paddle 2.6
        compat.fix_quality_focal_loss_mask()
    np.testing.assert_allclose(qfl(), want, rtol=1e-5)
    background = np.full(6, 3, "int64")               # no positives: every pair towards quality 0
    np.testing.assert_allclose(gfocal_loss.quality_focal_loss(
        paddle.to_tensor(pred), (paddle.to_tensor(background), paddle.to_tensor(score))).numpy(),
        _qfl_reference(pred, background, score), rtol=1e-5)


# ---------------------------------------------------------------- F12: Deformable DETR's and DINO's attention

def test_deformable_attention_samples_by_level_size(monkeypatch):
    from ppdet.modeling.transformers.deformable_transformer import MSDeformableAttention

    monkeypatch.setattr(MSDeformableAttention, "forward", _original(MSDeformableAttention.forward))
    paddle.seed(0)
    attn = MSDeformableAttention(embed_dim=16, num_heads=2, num_levels=2, num_points=2)
    core = attn.ms_deformable_attn_core
    sizes = paddle.to_tensor([[4, 6], [2, 3]], dtype="int64")                  # (H, W) of two levels
    rng = np.random.default_rng(0)
    query = paddle.to_tensor(rng.normal(size=(1, 5, 16)).astype("float32"))
    value = paddle.to_tensor(rng.normal(size=(1, 30, 16)).astype("float32"))
    start = paddle.to_tensor([0, 24], dtype="int64")
    xy = rng.uniform(0.1, 0.9, (1, 5, 2, 2)).astype("float32")
    # the same sampling through the box branch, which never divides by the sizes: offset x (2 / points) x wh / 2
    wh = np.broadcast_to(2 * 2 / np.array([[6, 4], [3, 2]], "float32"), (1, 5, 2, 2))
    want = attn(query, paddle.to_tensor(np.concatenate([xy, wh], -1)), value, sizes, start).numpy()

    def by_points():
        return attn(query, paddle.to_tensor(xy), value, sizes, start).numpy()

    if PADDLE3:
        with pytest.raises(TypeError, match="Type promotion"):
            by_points()                                 # float32 offsets / int64 sizes
        assert compat.apply_ppdet_fixes() == ["MSDeformableAttention.forward"]
    else:
        np.testing.assert_allclose(by_points(), want, rtol=1e-5, atol=1e-6)   # ppdet's own on Paddle 2.6
        compat.fix_deformable_attention_offsets()
    np.testing.assert_allclose(by_points(), want, rtol=1e-5, atol=1e-6)
    assert attn.ms_deformable_attn_core is core        # the sampling core is given back after each call


# ---------------------------------------------------------------- F13: DINO's denoising queries

def test_dino_denoising_queries(monkeypatch):
    from ppdet.modeling.transformers import dino_transformer, utils

    original = _original(utils.get_contrastive_denoising_training_group)
    monkeypatch.setattr(utils, "get_contrastive_denoising_training_group", original)
    monkeypatch.setattr(dino_transformer, "get_contrastive_denoising_training_group", original)

    def queries(func):
        paddle.seed(0)
        targets = {"gt_class": [paddle.to_tensor([[1], [2]], dtype="int32"), paddle.to_tensor([[0]], dtype="int32")],
                   "gt_bbox": [paddle.rand([2, 4]) * 0.5 + 0.2, paddle.rand([1, 4]) * 0.5 + 0.2]}
        return func(targets, 3, 10, paddle.rand([3, 8]), num_denoising=8)

    if PADDLE3:
        with pytest.raises(TypeError, match="Type promotion"):
            queries(original)                        # bool noise mask x float32 padding mask
        assert compat.apply_ppdet_fixes() == ["get_contrastive_denoising_training_group"]
    else:
        want = queries(original)
        compat.fix_dino_denoising_mask()
        for got, ref in zip(queries(utils.get_contrastive_denoising_training_group)[:3], want[:3]):
            np.testing.assert_array_equal(got.numpy(), ref.numpy())   # the fix changes nothing on Paddle 2.6
    assert dino_transformer.get_contrastive_denoising_training_group is utils.get_contrastive_denoising_training_group
    classes, boxes, attn_mask, meta = queries(utils.get_contrastive_denoising_training_group)
    # 4 groups (8 // 2 gts at most) of 2 positive and 2 negative queries per image, then the 10 matching queries
    assert classes.shape == [2, 16, 8] and boxes.shape == [2, 16, 4] and attn_mask.shape == [26, 26]
    assert meta["dn_num_split"] == [16, 10] and meta["dn_num_group"] == 4
    assert [len(i) for i in meta["dn_positive_idx"]] == [8, 4]
    if PADDLE3:
        with pytest.raises(TypeError, match="Type promotion"):
            paddle.to_tensor([True]) * paddle.to_tensor([2.0])   # only inside ppdet's function


# ---------------------------------------------------------------- Paddle 3's import notice

_CCACHE = "No ccache found"


def _import_paddle_stderr(code: str, tmp_path: Path) -> str:
    # PATH without ccache: Paddle looks for it on PATH and with `which`
    env = {**os.environ, "PATH": str(tmp_path), "PYTHONPATH": str(REPO), "PYTHONWARNINGS": "default"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stderr


def test_paddle_import_notice_is_filtered_before_paddle_loads(tmp_path):
    plain = _import_paddle_stderr("import paddle", tmp_path)
    assert (_CCACHE in plain) == PADDLE3           # Paddle 3 warns in every process; 2.6 never did
    quiet = _import_paddle_stderr("import ppmulti.rank, paddle", tmp_path)
    assert _CCACHE not in quiet


def test_a_launched_script_that_imports_paddle_first_stays_quiet(tmp_path):
    """Every rank of ``ppmulti launch`` runs through worker.py (by path, so ppmulti/rank/__init__.py never runs)."""
    script = tmp_path / "user_script.py"
    script.write_text("import paddle\n")
    stderr = _import_paddle_stderr(
        f"import runpy, sys; sys.argv = ['worker.py', {str(script)!r}]; "
        f"runpy.run_path({str(REPO / 'ppmulti' / 'rank' / 'worker.py')!r}, run_name='__main__')", tmp_path)
    assert _CCACHE not in stderr


def test_paddle_import_filter_is_narrow():
    """Only that message from that module is hidden: the same words elsewhere, or another warning there, still show."""
    import warnings

    module = "paddle.utils.cpp_extension.extension_utils"
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        compat.before_paddle_import()
        compat.before_paddle_import()   # twice: still one filter
        for text, where in ((f"{_CCACHE}. Please be aware ...", module),
                            (f"{_CCACHE}. Please be aware ...", "somewhere.else"),
                            ("another warning from Paddle's extension utils", module)):
            warnings.warn_explicit(text, UserWarning, "x.py", 1, module=where)
        warnings.warn_explicit(f"{_CCACHE}. Please be aware ...", DeprecationWarning, "x.py", 1, module=module)
    assert [(str(w.message), w.category) for w in seen] == [
        (f"{_CCACHE}. Please be aware ...", UserWarning),
        ("another warning from Paddle's extension utils", UserWarning),
        (f"{_CCACHE}. Please be aware ...", DeprecationWarning)]
