"""Validation's rect letterbox (tools/eval.py --rect, `ppmulti yolo val`'s default): shapes, margins, sharding,
box mapping. The expected shapes and margins are ultralytics 8.4.190's val rule (data/base.py set_rectangle,
data/augment.py LetterBox, read from its source): batch shape ceil(ratio * imgsz / 32 + 0.5) * 32, the image
centred with the odd pixel at the bottom/right, never enlarged by the letterbox."""

from __future__ import annotations

import types

import numpy as np
import pytest

from ppmulti.common.ultra_keys import resolve_line
from ppmulti.rank.data.augment import VAL_RECT_PAD, rect_shapes, val_letterbox
from ppmulti.rank.engine.evaluator import shard_indices
from ppmulti.rank.yolo_config import apply_val_rect


def test_square_images_get_half_a_stride_of_margin_on_every_side():
    img = np.random.RandomState(0).randint(0, 255, (256, 256, 3), dtype=np.uint8)
    (shape,) = rect_shapes(np.array([[256.0, 256.0]]), 1, 256, 32, VAL_RECT_PAD)
    assert tuple(shape) == (288, 288)
    out, gain, offset = val_letterbox(img, 256, tuple(shape))
    assert out.shape == (288, 288, 3) and gain == (1.0, 1.0) and offset == (16, 16)
    assert np.array_equal(out[16:272, 16:272], img)          # not resampled
    assert (out[:16] == 114).all() and (out[:, 272:] == 114).all()


def test_a_wide_image_is_brought_to_imgsz_then_centred_in_its_batch_shape():
    img = np.zeros((100, 201, 3), np.uint8)
    hw = np.array([[100.0, 201.0], [100.0, 200.0]])             # one batch of two, ratios 0.4975 and 0.5
    (shape,) = rect_shapes(hw, 2, 256, 32, VAL_RECT_PAD)
    assert tuple(shape) == (160, 288)                           # ceil(0.5 * 8 + 0.5) * 32, ceil(8 + 0.5) * 32
    out, gain, offset = val_letterbox(img, 256, (160, 288))
    # 100 x 201 -> 128 x 256 (ceil(100 * 256 / 201) = 128); margins 16 top / 16 bottom, 16 left / 16 right
    assert out.shape == (160, 288, 3) and offset == (16, 16)
    assert gain == pytest.approx((128 / 100, 256 / 201))
    odd, _, odd_offset = val_letterbox(np.zeros((256, 255, 3), np.uint8), 256, (288, 288))
    assert odd.shape == (288, 288, 3) and odd_offset == (16, 16)   # 33 px of width: 16 left, 17 right


def test_rect_shards_hand_each_rank_whole_batches():
    n, world, batch = 10, 2, 3
    shards = [shard_indices(n, r, world, batch) for r in range(world)]
    assert shards == [[0, 1, 2, 6, 7, 8], [3, 4, 5, 9]]
    assert sorted(shards[0] + shards[1]) == list(range(n))
    assert shard_indices(n, 1, world) == [1, 3, 5, 7, 9]        # without rect: strided, as before


def _cfg(arch="UltraYOLO", dataset="YOLODataSet"):
    return {"architecture": arch, "eval_height": 256, "eval_width": 256,
            "EvalDataset": {"name": dataset, "data": "d.yaml", "split": "val"},
            "EvalReader": {"batch_size": 16, "sample_transforms": [
                {"Decode": {}}, {"Resize": {"target_size": [256, 256], "keep_ratio": True}},
                {"Pad": {"size": [256, 256]}}, {"NormalizeImage": {}}, {"Permute": {}}]}}


def test_apply_val_rect_swaps_the_letterbox_and_marks_the_dataset():
    cfg = _cfg()
    assert apply_val_rect(cfg) is None
    assert [next(iter(op)) for op in cfg["EvalReader"]["sample_transforms"]] == \
        ["Decode", "RectLetterbox", "NormalizeImage", "Permute"]
    assert cfg["EvalReader"]["sample_transforms"][1]["RectLetterbox"] == {"img_size": 256}
    assert cfg["EvalDataset"] | {} == {"name": "YOLODataSet", "data": "d.yaml", "split": "val", "rect": True,
                                       "rect_batch": 16, "rect_size": 256, "rect_pad": 0.5}


@pytest.mark.parametrize("arch,dataset", [("YOLOv5", "YOLODataSet"), ("UltraYOLO", "COCODataSet")])
def test_rect_is_skipped_with_its_reason_where_it_cannot_apply(arch, dataset):
    cfg = _cfg(arch, dataset)
    reason = apply_val_rect(cfg)
    assert ("YOLOv8/11/26" if arch != "UltraYOLO" else "YOLO data yaml") in reason
    assert cfg == _cfg(arch, dataset)


def test_yolo_val_letterboxes_rect_by_default_as_ultralytics_val():
    assert resolve_line(["val", "model=best.pt", "data=d.yaml"]).argv[8] == "--rect"
    assert "--rect" not in resolve_line(["val", "model=best.pt", "data=d.yaml", "rect=False"]).argv
    assert "--rect" not in resolve_line(["predict", "model=best.pt", "source=x"]).argv


def test_yolo_val_reads_yolo26_as_ultralytics_nms_key_says():
    """ultralytics 8.4.190's val: nms=None (default) and True -> one-to-many head through NMS, nms=False -> the
    one-to-one head (engine/validator.py: end2end=self.args.nms is False)."""
    def e2e(*keys):
        argv = resolve_line(["val", "model=best.pt", "data=d.yaml", *keys]).argv
        return argv[argv.index("--end2end") + 1]

    assert (e2e(), e2e("nms=True"), e2e("nms=False")) == ("false", "false", "true")


def test_boxes_lose_the_margin_then_the_gain_and_are_clipped_after_nms():
    import paddle

    from ppmulti.rank.models.ultra_yolo import UltraYOLO

    me = types.SimpleNamespace(_xyxy_rows=UltraYOLO._xyxy_rows)
    boxes = paddle.to_tensor([[[16.0, 20.0, 48.0, 80.0], [0.0, 0.0, 300.0, 300.0]]])      # input pixels
    scale = paddle.to_tensor([[[2.0, 2.0, 2.0, 2.0]]])
    offset, orig = paddle.to_tensor([[16.0, 16.0]]), paddle.to_tensor([[100.0, 120.0]])   # (top, left), (h, w)
    out = UltraYOLO._to_image(me, boxes, scale, offset, None).numpy()
    assert out.tolist() == [[[0.0, 2.0, 16.0, 32.0], [-8.0, -8.0, 142.0, 142.0]]]
    rows = paddle.to_tensor([[0.0, 0.75, -8.0, -8.0, 142.0, 142.0], [1.0, 0.5, 1.0, 2.0, 3.0, 4.0]])
    clipped = UltraYOLO._clip_rows(me, rows, paddle.to_tensor([2], dtype="int32"), orig).numpy()
    assert clipped.tolist() == [[0.0, 0.75, 0.0, 0.0, 120.0, 100.0], [1.0, 0.5, 1.0, 2.0, 3.0, 4.0]]


def _yolo26(end2end=None):
    from ppdet.core.workspace import create

    from ppmulti.common.paths import CONFIGS
    from ppmulti.rank import config as config_mod

    cfg = config_mod.load(CONFIGS / "yolo26/yolo26_n_500e_coco.yml",
                          {"num_classes": 3, "UltraYOLO": {"verbose": False}})
    if end2end is not None:
        cfg["UltraYOLO"]["end2end"] = end2end
    return cfg, create(cfg.architecture)


def test_training_evaluation_picks_yolo26s_head_and_puts_it_back():
    """The plan's val_end2end (ultralytics' trainer: end2end = nms is False) for the evaluation only: the head the
    run saves and predicts with stays its config's."""
    from ppmulti.rank.engine.hooks.evaluation import pick_head

    _, model = _yolo26()
    assert model.head.end2end is True
    assert pick_head(model, False) is True and model.head.end2end is False
    model.head.end2end = True
    assert pick_head(model, None) is None and model.head.end2end is True       # YOLOv5 / PaddleDetection lines
    assert pick_head(types.SimpleNamespace(), False) is None                   # no such head: nothing changed


def test_training_evaluation_takes_rect_where_val_would():
    from ppmulti.rank.engine.hooks.evaluation import val_rect

    cfg = _cfg()
    assert val_rect(cfg) is True and "RectLetterbox" in cfg["EvalReader"]["sample_transforms"][1]
    # the hook passes twice the per-rank training batch, as ultralytics' trainer batches its val loader
    cfg = _cfg()
    assert val_rect(cfg, 32) is True
    assert cfg["EvalReader"]["batch_size"] == cfg["EvalDataset"]["rect_batch"] == 32
    cfg = _cfg("YOLOv5")
    assert val_rect(cfg, 32) is False and cfg == _cfg("YOLOv5")   # its config's letterbox and batch


@pytest.mark.parametrize("end2end,through_nms", [("false", True), ("true", False), (None, False)])
def test_yolo26_predict_goes_through_nms_unless_end2end(tmp_path, end2end, through_nms):
    """tools/detect.py --end2end (`ppmulti yolo predict` nms=None/True -> false, nms=False -> true): false builds the
    one-to-many head with NMS left out of the graph, so detect's NMS runs on raw boxes and scores; true (and the
    config's own, without the flag) takes the one-to-one head's top-k rows as they come."""
    import paddle

    from ppmulti.common.paths import CONFIGS
    from ppmulti.rank.engine.detect import PaddleBackend
    from ppmulti.rank.eval_setup import detect_edit

    _, model = _yolo26()
    weights = tmp_path / "w.pdparams"
    paddle.save(model.state_dict(), str(weights))
    backend = PaddleBackend(str(CONFIGS / "yolo26/yolo26_n_500e_coco.yml"), ["num_classes=3"], str(weights),
                            detect_edit(64, False, end2end=end2end))
    assert backend.end2end is not through_nms
    pred = backend.predict(np.random.RandomState(0).randint(0, 255, (64, 80, 3), dtype=np.uint8))
    assert (pred.dets is None) is through_nms and (pred.scores is not None) is through_nms
    if through_nms:
        assert pred.scores.shape[0] == 3 and pred.boxes.shape[1] == 4   # every candidate, for the NMS after it


def test_val_losses_take_the_rect_margin_too():
    """The labels reach the centred letterbox's input by the gain, then its (top, left) margin."""
    import paddle

    from ppmulti.rank.engine.val_loss import ValLoss

    val = ValLoss(None, lambda i: np.array([[1, 10.0, 20.0, 30.0, 40.0]]))
    data = {"im_id": paddle.to_tensor([[7]]), "scale_factor": paddle.to_tensor([[2.0, 2.0]]),
            "pad_offset": paddle.to_tensor([[16.0, 8.0]])}
    assert val.targets(data)["gt_bbox"].numpy().tolist() == [[[28.0, 56.0, 68.0, 96.0]]]
    del data["pad_offset"]
    assert val.targets(data)["gt_bbox"].numpy().tolist() == [[[20.0, 40.0, 60.0, 80.0]]]
