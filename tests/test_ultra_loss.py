"""Ultralytics 8.4's losses in Paddle (models/ultra_loss.py, ultra_assign.py): hand-made cases with known answers,
and agreement with ultralytics' own numbers (tests/fixtures/ultra_loss_golden.json)."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest

import paddle  # noqa: E402 (installed with ppmulti)

from ppmulti.rank.models.ultra_assign import (TaskAlignedAssigner, bbox2dist, bbox_ciou_xyxy,  # noqa: E402
                                              dist2bbox, make_anchors)
from ppmulti.rank.models.ultra_loss import UltraDetectionLoss, UltraE2ELoss, e2e_weights  # noqa: E402

FIXTURES = Path(__file__).parent / "fixtures"
sys.path.insert(0, str(FIXTURES))
from ultra_loss_cases import STRIDES, case, e2e_case  # noqa: E402

# Measured with ultralytics 8.4.190 and torch 2.14.1 on CPU:
#   python tests/fixtures/ultra_loss_reference.py > tests/fixtures/ultra_loss_golden.json (torch + ultralytics venv)
GOLDEN = json.loads((FIXTURES / "ultra_loss_golden.json").read_text())


def t(x, dtype="float32"):
    return paddle.to_tensor(np.asarray(x, dtype=dtype))


def ciou_by_hand(a, b):
    """CIoU from its definition (Zheng et al. 2020), in float64, no eps."""
    w1, h1, w2, h2 = a[2] - a[0], a[3] - a[1], b[2] - b[0], b[3] - b[1]
    iw = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    ih = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = iw * ih
    iou = inter / (w1 * h1 + w2 * h2 - inter)
    cw, ch = max(a[2], b[2]) - min(a[0], b[0]), max(a[3], b[3]) - min(a[1], b[1])
    rho2 = ((a[0] + a[2] - b[0] - b[2]) / 2) ** 2 + ((a[1] + a[3] - b[1] - b[3]) / 2) ** 2
    v = 4 / math.pi ** 2 * (math.atan(w2 / h2) - math.atan(w1 / h1)) ** 2
    alpha = v / (1 - iou + v) if v else 0.0
    return iou - rho2 / (cw ** 2 + ch ** 2) - alpha * v


@pytest.mark.parametrize("a, b", [([0, 0, 2, 2], [1, 1, 3, 3]),      # same aspect: IoU 1/7 - 2/18
                                  ([0, 0, 4, 2], [0, 0, 2, 2]),      # different aspect: the v term
                                  ([0, 0, 1, 1], [5, 5, 6, 8]),      # disjoint: negative
                                  ([10, 20, 50, 40], [10, 20, 50, 40])])
def test_ciou_of_known_boxes(a, b):
    got = float(bbox_ciou_xyxy(t(a), t(b)))
    assert got == pytest.approx(ciou_by_hand(a, b), abs=2e-6)
    assert ciou_by_hand([0, 0, 2, 2], [1, 1, 3, 3]) == pytest.approx(1 / 7 - 2 / 18)


def test_anchors_are_cell_centres_row_major():
    points, strides = make_anchors([(2, 3), (1, 1)], [8, 16])
    assert points.numpy().tolist() == [[0.5, 0.5], [1.5, 0.5], [2.5, 0.5], [0.5, 1.5], [1.5, 1.5], [2.5, 1.5],
                                       [0.5, 0.5]]
    assert strides.numpy().ravel().tolist() == [8] * 6 + [16]


def test_distances_round_trip_and_clip():
    points = t([[2.0, 3.0]])
    box = t([[0.5, 1.0, 4.0, 25.0]])
    assert bbox2dist(points, box).numpy().tolist() == [[1.5, 2.0, 2.0, 22.0]]
    assert dist2bbox(bbox2dist(points, box), points).numpy().tolist() == box.numpy().tolist()
    assert bbox2dist(points, box, 15).numpy()[0].tolist() == pytest.approx([1.5, 2.0, 2.0, 14.99])


def _one_gt_scene(scores_at, gt=(0.0, 0.0, 32.0, 32.0), nc=2, cls=1):
    """A 64 px image (levels 8x8, 4x4, 2x2 = 84 anchors), one gt, every anchor predicting the gt box exactly and
    class ``cls`` with probability ``scores_at(anchor)``."""
    points, stride = make_anchors([(8, 8), (4, 4), (2, 2)], STRIDES)
    pix = (points * stride).numpy()
    a = len(pix)
    probs = np.zeros((1, a, nc), np.float32)
    probs[0, :, cls] = [scores_at(i) for i in range(a)]
    boxes = np.tile(np.asarray(gt, np.float32), (1, a, 1))
    return (t(probs), t(boxes), t(pix), t([[[cls]]]), t([[list(gt)]]), t([[[1.0]]])), pix


def test_assigner_takes_the_topk_best_aligned_candidates_inside_the_gt():
    # the gt [0, 32] holds 16 + 4 + 1 = 21 anchor centres; scores rise with the anchor index
    args, pix = _one_gt_scene(lambda i: 0.01 + 0.001 * i)
    inside = [i for i, (x, y) in enumerate(pix) if 0 < x < 32 and 0 < y < 32]
    assert len(inside) == 21
    out = TaskAlignedAssigner(topk=10, num_classes=2, strides=STRIDES)(*args)
    fg = np.nonzero(out.fg.numpy()[0])[0].tolist()
    assert fg == sorted(inside)[-10:]   # the 10 highest scores among the candidates, none outside the gt
    # every positive's class target: align / best align x best CIoU (1 here) = sqrt(s / s_max)
    s = np.array([0.01 + 0.001 * i for i in fg])
    assert out.scores.numpy()[0, fg, 1] == pytest.approx(np.sqrt(s / s.max()), rel=1e-5)
    assert out.scores.numpy()[0, :, 0].max() == 0
    assert out.boxes.numpy()[0, fg].tolist() == [[0.0, 0.0, 32.0, 32.0]] * 10


def test_assigner_topk2_keeps_one_per_gt():
    args, pix = _one_gt_scene(lambda i: 0.01 + 0.001 * i)
    out = TaskAlignedAssigner(topk=7, num_classes=2, strides=STRIDES, topk2=1)(*args)
    fg = np.nonzero(out.fg.numpy()[0])[0].tolist()
    inside = [i for i, (x, y) in enumerate(pix) if 0 < x < 32 and 0 < y < 32]
    assert fg == [max(inside)]
    assert out.scores.numpy()[0, fg[0], 1] == pytest.approx(1.0, rel=1e-6)


def test_tiny_gt_is_widened_to_the_second_stride():
    # a 4 px box at (20, 20): its own area holds one stride-8 centre, widened to 16 px it holds one per level
    gt = (18.0, 18.0, 22.0, 22.0)
    args, _ = _one_gt_scene(lambda i: 0.5, gt=gt)
    out = TaskAlignedAssigner(topk=10, num_classes=2, strides=STRIDES)(*args)
    assert int(out.fg.numpy().sum()) == 3


def test_anchor_claimed_by_two_gts_goes_to_the_larger_overlap():
    # one anchor (centre 12, 12 at stride 8 ... and all others far) inside two gts; it predicts gt 1 exactly
    points, stride = make_anchors([(2, 2)], [8.0])
    pix = (points * stride).numpy()                       # centres 4, 12
    gts = [[0.0, 0.0, 16.0, 16.0], [2.0, 2.0, 14.0, 15.0]]
    probs = t(np.full((1, 4, 1), 0.5))
    boxes = t(np.tile(np.asarray(gts[1], np.float32), (1, 4, 1)))
    out = TaskAlignedAssigner(topk=10, num_classes=1, strides=[8.0])(
        probs, boxes, t(pix), t([[[0], [0]]]), t([gts]), t([[[1.0], [1.0]]]))
    assert out.fg.numpy()[0].tolist() == [True] * 4
    assert out.gt_index.numpy()[0].tolist() == [1, 1, 1, 1]


def test_padded_gts_are_ignored():
    args, _ = _one_gt_scene(lambda i: 0.3)
    probs, boxes, pix, _, _, _ = args
    labels = t([[[1], [0]]])
    gts = t([[[0.0, 0.0, 32.0, 32.0], [0.0, 0.0, 0.0, 0.0]]])
    one = TaskAlignedAssigner(topk=10, num_classes=2, strides=STRIDES)(*args)
    two = TaskAlignedAssigner(topk=10, num_classes=2, strides=STRIDES)(probs, boxes, pix, labels, gts,
                                                                        t([[[1.0], [0.0]]]))
    assert np.array_equal(one.fg.numpy(), two.fg.numpy())
    assert np.allclose(one.scores.numpy(), two.scores.numpy())


def _head(boxes, scores, shapes):
    feats = [paddle.zeros([boxes.shape[0], 1, h, w]) for h, w in shapes]
    return {"boxes": t(boxes), "scores": t(scores), "feats": feats}


def test_perfect_prediction_costs_nothing():
    # one gt, 4 x 4 stride-8 cells apart from its anchor in whole cells: integer DFL targets
    shapes = [(8, 8), (4, 4), (2, 2)]
    a, reg_max, nc = 84, 16, 2
    boxes = np.zeros((1, 4 * reg_max, a), np.float32)
    scores = np.full((1, nc, a), -30.0, np.float32)
    anchor = 1 * 8 + 1                                   # centre (12, 12) px = (1.5, 1.5) cells
    gt = [4.0, 4.0, 28.0, 36.0]                          # l, t, r, b = 1, 1, 2, 3 cells from it
    for side, dist in enumerate([1, 1, 2, 3]):
        boxes[0, side * reg_max + dist, anchor] = 40.0   # all the mass on the right bin
    scores[0, 1, anchor] = 30.0
    inputs = {"gt_bbox": t([[gt]]), "gt_class": t([[[1]]], "int32"), "pad_gt_mask": t([[[1.0]]]),
              "image": paddle.zeros([1, 3, 64, 64])}
    out = UltraDetectionLoss(num_classes=nc, topk=1, strides=STRIDES)(_head(boxes, scores, shapes), inputs)
    for key in ("loss_box", "loss_cls", "loss_dfl", "loss"):
        assert float(out[key]) < 1e-5, key
    # a wrong class costs: the same boxes, the other class predicted
    scores[0, 0, anchor], scores[0, 1, anchor] = 30.0, -30.0
    worse = UltraDetectionLoss(num_classes=nc, topk=1, strides=STRIDES)(_head(boxes, scores, shapes), inputs)
    assert float(worse["loss_cls"]) > 1.0


def _inputs(c):
    return {"gt_bbox": t(c["gt_bbox"]), "gt_class": t(c["gt_class"], "int32"), "pad_gt_mask": t(c["pad_gt_mask"]),
            "image": paddle.zeros([len(c["gt_bbox"]), 3, c["imgsz"], c["imgsz"]])}


def _grad_sums(head):
    b, s = head["boxes"].grad.numpy(), head["scores"].grad.numpy()
    return {"grad_boxes_abs": np.abs(b).sum(), "grad_scores_abs": np.abs(s).sum(),
            "grad_boxes_sum": b.sum(), "grad_scores_sum": s.sum()}


def _rel(a, b):
    return abs(a - b) / max(abs(b), 1e-12)


def _check_grads(got, ref, suffix=""):
    """Gradient sums within 1e-4 of ultralytics'; a signed sum near zero (the DFL softmax's) against its absolute
    counterpart."""
    for key, value in got.items():
        scale = max(abs(ref[key + suffix]), 1e-3 * ref[key.replace("_sum", "_abs") + suffix])
        assert abs(float(value) - ref[key + suffix]) <= 1e-4 * scale, key


@pytest.mark.parametrize("ref", GOLDEN["v8"], ids=lambda r: f"seed{r['seed']}")
def test_v8_loss_equals_ultralytics(ref):
    c = case(ref["seed"], 16)
    head = _head(c["boxes"], c["scores"], c["shapes"])
    for v in (head["boxes"], head["scores"]):
        v.stop_gradient = False
    out = UltraDetectionLoss(num_classes=c["nc"], batch_scale="batch")(head, _inputs(c))
    out["loss"].backward()
    got = [float(out[k]) for k in ("loss_box", "loss_cls", "loss_dfl")]
    assert _rel(float(out["loss"]), ref["loss"]) < 1e-5
    for g, r in zip(got, ref["items"]):
        assert _rel(g, r) < 1e-5
    _check_grads(_grad_sums(head), ref)


@pytest.mark.parametrize("ref", GOLDEN["e2e"], ids=lambda r: f"seed{r['seed']}")
def test_yolo26_e2e_loss_equals_ultralytics(ref):
    c = e2e_case(ref["seed"])
    many = _head(c["boxes"], c["scores"], c["shapes"])
    one = _head(c["one2one_boxes"], c["one2one_scores"], c["shapes"])
    for v in (many["boxes"], many["scores"], one["boxes"], one["scores"]):
        v.stop_gradient = False
    crit = UltraE2ELoss(num_classes=c["nc"], reg_max=1, batch_scale="batch", epoch=ref["epochs"])
    inputs = dict(_inputs(c), epoch_id=ref["epoch"])
    assert crit.weights(ref["epoch"]) == pytest.approx((ref["o2m"], ref["o2o"]))
    out = crit({"one2many": many, "one2one": one}, inputs)
    out["loss"].backward()
    assert _rel(float(out["loss"]), ref["loss"]) < 1e-5
    for g, r in zip([float(out[k]) for k in ("loss_box", "loss_cls", "loss_dfl")], ref["items"]):
        assert _rel(g, r) < 1e-5
    _check_grads(_grad_sums(many), ref)
    _check_grads(_grad_sums(one), ref, "_o2o")


def test_e2e_schedule_runs_from_08_to_01():
    assert e2e_weights(0, 20) == pytest.approx((0.8, 0.2))
    assert e2e_weights(19, 20) == pytest.approx((0.1, 0.9))
    assert e2e_weights(50, 20) == pytest.approx((0.1, 0.9))
    assert e2e_weights(0, 1) == pytest.approx((0.8, 0.2))


def test_batch_scales():
    c = case(0, 16)
    head = _head(c["boxes"], c["scores"], c["shapes"])
    parts = UltraDetectionLoss(num_classes=c["nc"], batch_scale="batch")(head, _inputs(c))
    mean = float(parts["loss_box"] + parts["loss_cls"] + parts["loss_dfl"])
    assert float(parts["loss"]) == pytest.approx(mean * 3, rel=1e-6)
    ref = UltraDetectionLoss(num_classes=c["nc"], batch_scale="ref_batch", ref_batch=64)(head, _inputs(c))
    assert float(ref["loss"]) == pytest.approx(mean * 64, rel=1e-6)
    eff = UltraDetectionLoss(num_classes=c["nc"], batch_scale="effective", accumulate=4)(head, _inputs(c))
    assert float(eff["loss"]) == pytest.approx(mean * 3 * 4, rel=1e-6)   # world 1 here


def test_wrong_structure_is_named():
    c = e2e_case(10)
    many = _head(c["boxes"], c["scores"], c["shapes"])
    with pytest.raises(ValueError, match="UltraE2ELoss"):
        UltraDetectionLoss(num_classes=3, reg_max=1)({"one2many": many, "one2one": many}, _inputs(c))
    with pytest.raises(ValueError, match="UltraDetectionLoss"):
        UltraE2ELoss(num_classes=3)(many, _inputs(c))


def test_empty_batch_keeps_the_graph():
    c = case(3, 16, counts=(0, 0))
    head = _head(c["boxes"], c["scores"], c["shapes"])
    head["boxes"].stop_gradient = False
    head["scores"].stop_gradient = False
    out = UltraDetectionLoss(num_classes=c["nc"], batch_scale="batch")(head, _inputs(c))
    out["loss"].backward()
    assert float(out["loss_box"]) == 0.0 and float(out["loss_dfl"]) == 0.0
    assert head["boxes"].grad is not None and float(out["loss_cls"]) > 0


def test_configs_build_the_losses_with_the_runs_epochs():
    from ppdet.core.workspace import create

    from ppmulti.rank import config as config_mod
    from conftest import REPO

    cfg = config_mod.load(str(REPO / "configs/yolo26/yolo26_n_500e_coco.yml"), [])
    cfg["epoch"] = 7   # what --epochs 7 leaves in the config before the model is built
    loss = create("UltraE2ELoss")
    assert (loss.epochs, loss.one2many.ref_batch, loss.one2many.batch_scale) == (7, 64, "ref_batch")
    assert (loss.one2many.topk, loss.one2one.topk, loss.one2one.topk2) == (10, 7, 1)
    assert loss.weights(6) == pytest.approx((0.1, 0.9))


@pytest.mark.slow
@pytest.mark.multiproc
def test_two_ranks_average_to_one_process_on_the_whole_batch(tmp_path):
    """`ppmulti launch --nproc_per_node 2`: each rank's loss on its half of a batch whose halves hold 1 and 9 boxes
    (YOLOv8's loss, and YOLO26's two branches) gives, averaged over the ranks, one process's gradients on the whole
    batch: the normaliser is the mean of the ranks' assigned scores' sums."""
    import ultra_loss_ranks as ranks
    from launching import two_rank_arrays

    got = two_rank_arrays(str(FIXTURES / "ultra_loss_ranks.py"), tmp_path)
    for reg_max in (16, 1):
        c = ranks.batch(reg_max)
        whole, halves = ranks.params(c), ranks.params(c)
        ranks.loss_of(c, whole, slice(None)).backward()
        for rows in (slice(0, 2), slice(2, 4)):   # the control: each half over its own sum, as ultralytics' DDP
            ranks.loss_of(c, halves, rows).backward()
        for name, param in whole.items():
            want = param.grad.numpy()
            np.testing.assert_allclose(got[f"r{reg_max}_{name}"], want, rtol=1e-4, atol=1e-6,
                                       err_msg=f"reg_max {reg_max} {name}")
            per_rank_rule = halves[name].grad.numpy() / 2   # the mean of the two halves' gradients
            assert not np.allclose(per_rank_rule, want, rtol=1e-2, atol=1e-6), name
