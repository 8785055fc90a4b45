"""The ultralytics family's validation losses (engine/val_loss.py's UltraValLoss): on the evaluation's own forward
pass, equal to the training loss called directly on the same raw outputs and labels, averaged over batches."""

from __future__ import annotations

import numpy as np
import pytest

import paddle  # noqa: E402 (installed with ppmulti)

from ppmulti.common.paths import CONFIGS  # noqa: E402
from ppmulti.rank.engine.val_loss import ULTRA_PARTS, UltraValLoss, ValLoss, combine  # noqa: E402

CONFIGS_3 = ["yolov8/yolov8_n_500e_coco.yml", "yolo11/yolo11_n_500e_coco.yml", "yolo26/yolo26_n_500e_coco.yml"]

# labels by im_id in original-image pixels (class, x1, y1, x2, y2); image 3 has none
LABELS = {1: np.array([[0, 10.0, 12, 60, 70], [2, 70, 20, 120, 100]]), 2: np.array([[1, 5.0, 5, 40, 30]]),
          3: np.zeros((0, 5)), 4: np.array([[2, 30.0, 40, 90, 120], [0, 0, 0, 20, 25], [1, 50, 50, 80, 60]])}
# the eval letterbox of a 128 x 128 (1, 4) and a 100 x 160 (2, 3) image into 64 x 64: scale_factor alone
BATCHES = [{"im_id": [[1], [2]], "scale_factor": [[0.5, 0.5], [0.4, 0.4]]},
           {"im_id": [[3], [4]], "scale_factor": [[0.4, 0.4], [0.5, 0.5]]}]


def _model(config: str):
    from ppdet.core.workspace import create

    from ppmulti.rank import config as config_mod

    cfg = config_mod.load(CONFIGS / config, {"num_classes": 3, "UltraYOLO": {"verbose": False}})
    paddle.seed(3)
    model = create(cfg.architecture)
    model.eval()
    return model


def _batches():
    rng = np.random.default_rng(0)
    for b in BATCHES:
        yield {"image": paddle.to_tensor(rng.random((2, 3, 64, 64), dtype=np.float32)),
               "im_id": paddle.to_tensor(np.array(b["im_id"], np.int64)),
               "im_shape": paddle.to_tensor(np.full((2, 2), 64.0, np.float32)),
               "scale_factor": paddle.to_tensor(np.array(b["scale_factor"], np.float32))}


def _labels_in_input(data) -> dict:
    """The training reader's form of the batch's labels (input pixels, padded), built here by hand."""
    ids = data["im_id"].numpy().reshape(-1)
    scales = data["scale_factor"].numpy().reshape(-1, 2)
    rows = [LABELS[int(i)] for i in ids]
    m = max(1, max(len(r) for r in rows))
    box, cls, mask = np.zeros((2, m, 4), np.float32), np.zeros((2, m, 1), np.int32), np.zeros((2, m, 1), np.float32)
    for b, r in enumerate(rows):
        box[b, :len(r)] = r[:, 1:] * scales[b][[1, 0, 1, 0]]
        cls[b, :len(r), 0] = r[:, 0]
        mask[b, :len(r)] = 1
    return {"image": data["image"], "gt_bbox": paddle.to_tensor(box), "gt_class": paddle.to_tensor(cls),
            "pad_gt_mask": paddle.to_tensor(mask)}


def _raw_outputs(model, image):
    """The head's training-form outputs of the same eval network (BatchNorm on its running statistics): only the
    Detect layer's own flag is flipped, as its training forward returns the raw outputs."""
    head = model.head
    head.training = True
    try:
        return model._net(image)
    finally:
        head.training = False


@pytest.mark.parametrize("config", CONFIGS_3)
def test_val_loss_is_the_training_loss_on_the_eval_outputs(config):
    model = _model(config)
    val = ValLoss.for_model(model, lambda i: LABELS[i])
    assert isinstance(val, UltraValLoss) and val.parts == ULTRA_PARTS
    calls = []
    counter = model.head.register_forward_pre_hook(lambda layer, inputs: calls.append(1))
    with paddle.no_grad(), val:
        for data in _batches():
            out = model(data)
            assert out["bbox"].shape[1] == 6   # the detections as before
            val.add(data)
    counter.remove()
    assert len(calls) == 2   # one head forward per batch: the loss read the eval pass's outputs, no second pass
    assert model.head.keep_raw is False and model.head.raw is None   # left as found: inference keeps nothing
    sums, batches = val.state()
    assert batches == 2

    want = dict.fromkeys(ULTRA_PARTS, 0.0)
    with paddle.no_grad():
        for data in _batches():
            preds = _raw_outputs(model, data["image"])
            got = model.loss(preds, _labels_in_input(data))
            for k in ULTRA_PARTS:
                want[k] += float(got[k])
            if "one2one" in preds:   # YOLO26: the items are the one-to-one branch's, as ultralytics' E2ELoss logs
                one = model.loss.one2one.components(preds["one2one"], _labels_in_input(data))
                assert float(one["loss_box"]) == pytest.approx(float(got["loss_box"]), rel=1e-6)
    for k in ULTRA_PARTS:
        assert sums[k] == pytest.approx(want[k], rel=1e-5), k
        assert np.isfinite(sums[k]) and sums[k] > 0, k
    means = combine([val.state(), None])
    assert means == pytest.approx({k: want[k] / 2 for k in ULTRA_PARTS}, rel=1e-5)


def test_yolo26_val_loss_does_not_depend_on_the_branch_inference_reads():
    """ultralytics' eval runs both branches whatever `nms` picks; so does the head here, and the loss reads both."""
    model = _model("yolo26/yolo26_n_500e_coco.yml")
    results = []
    for end2end in (True, False):
        model.head.end2end = end2end
        val = ValLoss.for_model(model, lambda i: LABELS[i])
        with paddle.no_grad(), val:
            for data in _batches():
                model(data)
                val.add(data)
        results.append(val.state()[0])
    assert results[0] == pytest.approx(results[1], rel=1e-6)


def test_no_val_loss_without_a_training_loss():
    from ppdet.core.workspace import create

    from ppmulti.rank import config as config_mod

    cfg = config_mod.load(CONFIGS / CONFIGS_3[1], {"num_classes": 3, "UltraYOLO": {"loss": None, "verbose": False}})
    assert ValLoss.for_model(create(cfg.architecture), lambda i: LABELS[i]) is None


def test_combine_averages_every_ranks_batches_by_their_own_keys():
    a = ({"loss_box": 1.0, "loss_cls": 2.0, "loss_dfl": 3.0}, 2)
    b = ({"loss_box": 2.0, "loss_cls": 1.0, "loss_dfl": 0.0}, 1)
    assert combine([a, b, None]) == pytest.approx({"loss_box": 1.0, "loss_cls": 1.0, "loss_dfl": 1.0})
    assert combine([None]) is None and combine([({"loss_box": 0.0}, 0)]) is None
