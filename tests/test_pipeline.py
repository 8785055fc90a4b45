"""The YOLOv5 reader's batches (ppmulti's YOLOv5 ops, uint8 normalised on the device) against YOLOv5's recipe
and against the old path (ppdet's Decode/Mosaic/AugmentHSV/RandomFlip/NormalizeImage/Permute, as the reader had
them): pixel and box statistics on the demo data; the device-side normalisation against ppdet's host one; and
YOLOv5's HSV gains applied on the device (as on a GPU) against cv2's on the host."""

from __future__ import annotations

import random

import numpy as np
import pytest

paddle = pytest.importorskip("paddle")

from ppmulti.common.paths import CONFIGS  # noqa: E402
from ppmulti.rank.data.device import hsv_on_device, input_norm, place_hsv, to_model_input  # noqa: E402

REPO = CONFIGS.parent

OLD_READER = {
    "mosaic_epoch": 0,
    "sample_transforms": [
        {"Decode": {}},
        {"Mosaic": {"prob": 1.0, "input_dim": [640, 640], "degrees": [0, 0], "translate": [-0.1, 0.1],
                    "scale": [0.5, 1.5], "shear": [0, 0], "enable_mixup": False}},
        {"AugmentHSV": {"is_bgr": False, "hgain": 5, "sgain": 30, "vgain": 30}},
        {"RandomFlip": {"prob": 0.5}},
    ],
    "batch_transforms": [
        {"NormalizeImage": {"mean": [0.0, 0.0, 0.0], "std": [1.0, 1.0, 1.0], "is_scale": True}},
        {"Permute": {}},
        {"PadGT": {}},
    ],
}


def _batches(data_yaml, old: bool, n_batches: int, img: int = 320, seed: int = 0, device: str = "cpu",
             raw: list | None = None):
    """Float N x 3 x H x W batches in 0-1 and their boxes, as the model receives them, from a YOLOv5 command
    line (yolov5n, hyp.scratch-low) on ``data_yaml``; ``device`` places the HSV gains as a run on it would;
    ``raw`` collects each batch as the loader hands it over (numpy copies)."""
    from ppdet.core.workspace import create

    from ppmulti.common.train_flags import build_parser
    from ppmulti.rank import config as config_mod
    from ppmulti.rank.data.feed import Feed
    from ppmulti.rank.entry import resolve
    from ppmulti.rank.yolo_config import apply_edit

    args = build_parser().parse_args(["--cfg", "yolov5n", "--data", str(data_yaml), "--img", str(img),
                                      "--hyp", str(REPO / "configs/hyps/hyp.scratch-low.yaml"), "--batch", "16",
                                      "--workers", "0"])
    opts = resolve(args)
    cfg = config_mod.load(opts.config, opts.overrides)
    if old:
        for key, value in OLD_READER.items():
            cfg["TrainReader"][key] = value
    apply_edit(cfg, opts.edit)   # data, image size and the hyp values, mapped onto whichever ops are there
    place_hsv(cfg, device)
    cfg["TrainReader"]["batch_size"] = 16
    cfg["TrainReader"]["use_shared_memory"] = False
    random.seed(seed)
    np.random.seed(seed)
    # the trainer's way through a reader without workers (data.feed): one thread, stopped and joined by close(),
    # so that no batch of this call is drawn from the global generators after the next call has seeded them
    feed = Feed(create("TrainReader")(create("TrainDataset")(), 0))
    out = []
    try:
        for i, data in feed.epoch(0):
            if i >= n_batches:
                break
            if raw is not None:
                raw.append({k: v.numpy().copy() for k, v in data.items() if isinstance(v, paddle.Tensor)})
            data = to_model_input(data, input_norm(cfg))
            mask = data["pad_gt_mask"].numpy()[..., 0] > 0
            out.append((data["image"].numpy(), data["gt_bbox"].numpy(), mask))
    finally:
        feed.close()
    return out


def _stats(batches) -> dict:
    images = np.concatenate([b[0] for b in batches])
    boxes = np.concatenate([b[1][m] for b in batches for m in [b[2]]])
    per_image = np.concatenate([b[2].sum(1) for b in batches])
    spread = images.max(axis=1) - images.min(axis=1)   # 0 on grey pixels (the 114 fill, after HSV still grey)
    w, h = boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1]
    side = images.shape[-1]
    return {"mean": float(images.mean()), "std": float(images.std()), "grey": float((spread < 2 / 255).mean()),
            "boxes_per_image": float(per_image.mean()), "box_w": float(np.median(w) / side),
            "box_h": float(np.median(h) / side)}


@pytest.fixture(scope="module")
def demo_yaml(tmp_path_factory):
    from ppmulti.common.synthdata import generate

    root = tmp_path_factory.mktemp("pipeline_demo")
    generate(root, fmt="yolo", n_train=128, n_val=8, size=256)
    return root / "data.yaml"


def _reference_batches(data_yaml, n_images: int, img: int = 320, seed: int = 0):
    """YOLOv5's recipe written the way YOLOv5 writes it (tests/test_augment.py's canvas-then-warp reference,
    3 extra tiles drawn uniformly from the whole dataset, augment_hsv, fliplr), straight from the files."""
    import cv2

    from ppmulti.rank.data import augment as A
    from ppmulti.rank.data.images import ImageStore
    from ppmulti.rank.data.yolo import load_data_yaml, scan
    from test_augment import _yolov5_reference

    records, _ = scan(load_data_yaml(data_yaml), "train")
    store = ImageStore([r["im_file"] for r in records], img)
    rng = np.random.default_rng(seed)

    def tile(i):
        loaded = store.load(i)
        (h0, w0), (h, w) = loaded.orig_hw, loaded.hw
        return A.Tile(loaded.image, records[i]["gt_bbox"].astype(np.float64) * ([w / w0, h / h0] * 2),
                      np.zeros((len(records[i]["gt_bbox"]), 1), np.int32))

    images, boxes, counts = [], [], []
    for k in range(n_images):
        picks = [k % len(records), *rng.integers(0, len(records), 3)]
        rng.shuffle(picks)
        image, b = _yolov5_reference([tile(int(i)) for i in picks], img, A.AffineHyp(), int(rng.integers(1 << 30)))
        image = A.augment_hsv(image, A.hsv_gains(rng, 0.015, 0.7, 0.4), rgb=True)
        if rng.random() < 0.5:
            image, b = A.flip_lr(image, b)
        images.append(cv2.cvtColor(np.ascontiguousarray(image), cv2.COLOR_RGB2BGR).transpose(2, 0, 1) / 255.0)
        boxes.append(b)
        counts.append(len(b))
    mask = np.zeros((n_images, max(counts) or 1), bool)
    padded = np.zeros((n_images, mask.shape[1], 4))
    for i, b in enumerate(boxes):
        mask[i, :len(b)], padded[i, :len(b)] = True, b
    return [(np.stack(images), padded, mask)]


def test_new_pipeline_draws_yolov5s_statistics(demo_yaml):
    """The new path's batches against YOLOv5's recipe written YOLOv5's way (canvas then warp, uniform extra
    tiles) on the same 128 draws: pixel mean/std, share of grey (114 fill) pixels, boxes per image and median
    box width/height. The tolerances are the spread between two seeds of the same path on 128 images here
    (up to about 0.03 mean, 0.015 std, 0.03 grey, 0.55 boxes/image, 0.02 box side), doubled. The old path (ppdet's
    YOLOX-style Mosaic) misses them: its affine has no centring term, so it shows the canvas' top-left corner
    at scale s instead of its centre -- more fill, more and smaller boxes than YOLOv5 -- which this test shows."""
    reference = _stats(_reference_batches(demo_yaml, 128))
    new = _stats(_batches(demo_yaml, old=False, n_batches=8))
    old = _stats(_batches(demo_yaml, old=True, n_batches=8))
    tolerance = {"mean": 0.06, "std": 0.03, "grey": 0.06, "boxes_per_image": 1.2, "box_w": 0.04, "box_h": 0.04}
    print("\nreference", reference, "\nnew", new, "\nold", old)
    for key, tol in tolerance.items():
        assert abs(new[key] - reference[key]) < tol, (key, new[key], reference[key])
    missed = [k for k, tol in tolerance.items() if abs(old[k] - reference[k]) >= tol]
    assert {"boxes_per_image", "box_w", "box_h"} <= set(missed)


def test_device_normalisation_equals_ppdets_on_the_host():
    from ppdet.data.transform.operators import NormalizeImage as Norm, Permute as Perm

    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (2, 8, 10, 3), dtype=np.uint8)
    mean, std = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
    host = np.stack([Perm()(Norm(mean=mean, std=std, is_scale=True)({"image": im.astype(np.float32)}))["image"]
                     for im in images])
    cfg = {"TrainReader": {"batch_transforms": [{"DeviceNormalize": {"mean": mean, "std": std,
                                                                      "channels_last": True}}]}}
    device = to_model_input({"image": paddle.to_tensor(images)}, input_norm(cfg))["image"]
    assert device.shape == [2, 3, 8, 10] and device.dtype == paddle.float32
    np.testing.assert_allclose(device.numpy(), host, atol=1e-5)
    floats = paddle.to_tensor(host)
    assert to_model_input({"image": floats}, None)["image"] is floats   # no DeviceNormalize: the loader's floats
    # PP-YOLOE's reader: raw float32 pixels (0-255 scale, past 255 after RandomDistort's contrast) leave the host
    raw = images.astype(np.float32) * 1.3
    expect = np.stack([Perm()(Norm(mean=mean, std=std, is_scale=True)({"image": im.copy()}))["image"] for im in raw])
    device = to_model_input({"image": paddle.to_tensor(raw)}, input_norm(cfg))["image"]
    np.testing.assert_allclose(device.numpy(), expect, atol=1e-5)


@pytest.fixture(scope="module")
def mixed_shapes_yaml(tmp_path_factory):
    """12 images of three aspect ratios (wide, tall, square), one box each, in shuffled file order."""
    import cv2

    root = tmp_path_factory.mktemp("rect_data")
    (root / "images").mkdir()
    (root / "labels").mkdir()
    sizes = [(100, 200), (200, 100), (150, 150)] * 4
    order = np.random.default_rng(0).permutation(len(sizes))
    for k, i in enumerate(order):
        h, w = sizes[i]
        cv2.imwrite(str(root / "images" / f"{k:02d}.png"), np.full((h, w, 3), 60 + 10 * k, np.uint8))
        (root / "labels" / f"{k:02d}.txt").write_text("0 0.5 0.5 0.5 0.5\n")
    (root / "data.yaml").write_text(f"path: {root}\ntrain: images\nval: images\nnames: [a]\n")
    return root / "data.yaml"


def _rect_loader(data_yaml, batch: int, extra=()):
    from ppdet.core.workspace import create

    from ppmulti.common.train_flags import build_parser
    from ppmulti.rank import config as config_mod
    from ppmulti.rank.entry import resolve
    from ppmulti.rank.yolo_config import apply_edit, set_rect_batch

    args = build_parser().parse_args(["--cfg", "yolov5n", "--data", str(data_yaml), "--img", "128", "--rect",
                                      "--batch", str(batch), "--workers", "0", *extra])
    opts = resolve(args)
    cfg = config_mod.load(opts.config, opts.overrides)
    apply_edit(cfg, opts.edit)
    set_rect_batch(cfg, batch)   # as the builder does from its batch plan (one process: the global batch)
    cfg["TrainReader"]["batch_size"] = batch
    cfg["TrainReader"]["use_shared_memory"] = False
    dataset = create("TrainDataset")()
    return cfg, dataset, create("TrainReader")(dataset, 0)


def test_rect_batches_are_letterboxed_to_their_own_shape(mixed_shapes_yaml):
    cfg, dataset, loader = _rect_loader(mixed_shapes_yaml, 4)
    assert cfg["TrainReader"]["shuffle"] is False and cfg["TrainDataset"]["rect"] is True
    ratios = [r["h"] / r["w"] for r in dataset.roidbs]
    assert ratios == sorted(ratios)   # aspect-ratio order, as YOLOv5 sorts
    shapes = [tuple(b["image"].shape[1:3]) for b in loader]
    # wide images (h/w 0.5) -> 64 x 128, square -> 128 x 128, tall (h/w 2) -> 128 x 64
    assert shapes == [(64, 128), (128, 128), (128, 64)]
    for epoch in range(2):   # no shuffle: the same batches every epoch
        assert [tuple(b["image"].shape[1:3]) for b in loader] == shapes
    batch = next(iter(loader))
    assert batch["gt_bbox"].shape[1] == 1   # one box per image: letterbox, not a mosaic of four


def test_rect_shapes_agree_across_ranks(mixed_shapes_yaml):
    """Paddle's DistributedBatchSampler (what ppdet's loader uses) hands each rank a contiguous slice of every
    global batch; the shapes are per global batch, so both ranks' batches of a step share one shape."""
    from paddle.io import DistributedBatchSampler

    _, dataset, _ = _rect_loader(mixed_shapes_yaml, 4)   # global batch 4 = 2 per rank on 2 ranks
    steps = [list(DistributedBatchSampler(dataset, batch_size=2, num_replicas=2, rank=r, shuffle=False))
             for r in range(2)]
    assert len(steps[0]) == len(steps[1]) == 3
    for batch0, batch1 in zip(*steps):
        shapes = {dataset.rect_shape(i, 128) for i in batch0 + batch1}
        assert len(shapes) == 1


def test_rect_is_refused_for_a_coco_dataset(tmp_path):
    from ppmulti.common.errors import UserError

    with pytest.raises(UserError, match="--rect works with YOLOv5 data yamls"):
        _rect_loader(REPO / "configs/datasets/demo_coco.yml", 4)


class _CountingStore:
    """An ImageStore stand-in: flat images of 100 x 150 (h x w), counting loads per index."""

    def __init__(self, n):
        from collections import Counter

        self.loads, self.n = Counter(), n

    def load(self, index):
        from ppmulti.rank.data.images import Loaded

        self.loads[index] += 1
        return Loaded(np.full((100, 150, 3), index % 250, np.uint8), (200, 300), (100, 150))


class _Source:
    def __init__(self, n):
        self.roidbs = [{"im_id": np.array([i]), "gt_bbox": np.array([[30.0, 40.0, 230.0, 160.0]], np.float32),
                        "gt_class": np.array([[i % 3]], np.int32), "is_crowd": np.zeros((1, 1), np.int32),
                        "h": 200.0, "w": 300.0} for i in range(n)]
        self.store = _CountingStore(n)

    def image_store(self, size):
        return self.store


def test_mosaic_op_decodes_each_image_once_and_bounds_its_buffer():
    from ppmulti.rank.data.pipeline import register_ops

    op = register_ops()["YOLOv5Mosaic"](img_size=160, buffer=16)
    source = _Source(40)
    random.seed(0)
    np.random.seed(0)
    for index in range(40):   # one epoch in order
        out = op({"_source": source, "_index": index, "curr_iter": index})
        assert out["image"].shape == (160, 160, 3) and out["image"].dtype == np.uint8
        assert len(out["gt_bbox"]) == len(out["gt_class"]) == len(out["is_crowd"])
        assert int(out["im_id"][0]) == index and len(op._buffer) <= 16
    loads = source.store.loads
    # every image loaded as its own sample; besides, only the 3 extra tiles of the first samples, until the
    # buffer held 8 images, were loaded from random indices
    assert set(loads) == set(range(40)) and sum(loads.values()) - 40 <= 3 * 8
    # the boxes came through the load's resize (300 -> 150 px wide): within the 160 px output
    assert out["gt_bbox"].max() <= 160


def test_mosaic_op_without_a_buffer_draws_its_extra_tiles_from_the_whole_set():
    """buffer 0 (--mosaic-buffer 0): YOLOv5's draw, every mosaic's 3 extra tiles loaded at random indices of the
    whole set, nothing kept between samples."""
    from ppmulti.rank.data.pipeline import register_ops

    op = register_ops()["YOLOv5Mosaic"](img_size=160, buffer=0)
    source = _Source(40)
    random.seed(0)
    np.random.seed(0)
    for index in range(20):   # the first half of an epoch, in order
        op({"_source": source, "_index": index})
        assert not op._buffer
    loads = source.store.loads
    assert sum(loads.values()) == 20 * 4   # its own image and 3 extras, each loaded
    assert any(i >= 20 for i in loads)     # extras from images no sample has reached yet


def test_mosaic_op_letterboxes_without_mosaic_and_mixes_up():
    from ppmulti.rank.data.pipeline import register_ops

    ops = register_ops()
    source = _Source(10)
    random.seed(1)
    np.random.seed(1)
    plain = ops["YOLOv5Mosaic"](img_size=160, prob=0.0, translate=0.0, scale=0.0)
    out = plain({"_source": source, "_index": 3})
    # 100 x 150 letterboxed into 160 x 160: 107 rows of image between grey bands, one box, scaled by 160/150
    assert (out["image"][:20] == 114).all() and (out["image"][80] == 3).all()
    np.testing.assert_allclose(out["gt_bbox"], [[16.0, 47.0, 122.67, 111.0]], atol=1.0)
    mixed = ops["YOLOv5Mosaic"](img_size=160, mixup=1.0)
    counts = [len(mixed({"_source": source, "_index": i})["gt_bbox"]) for i in range(10)]
    single = ops["YOLOv5Mosaic"](img_size=160)
    random.seed(1)
    np.random.seed(1)
    assert sum(counts) > sum(len(single({"_source": source, "_index": i})["gt_bbox"]) for i in range(10))


def test_mosaic_op_takes_plain_records_from_any_ppdet_dataset(tmp_path):
    """A COCO dataset with mosaic_epoch 0 hands 5 records with im_file; the op decodes them itself."""
    import cv2

    from ppmulti.rank.data.pipeline import register_ops

    records = []
    for i in range(5):
        path = tmp_path / f"{i}.jpg"
        cv2.imwrite(str(path), np.full((120, 160, 3), 40 * i, np.uint8))
        records.append({"im_file": str(path), "im_id": np.array([i]), "h": 120.0, "w": 160.0,
                        "gt_bbox": np.array([[10.0, 10.0, 100.0, 90.0]], np.float32),
                        "gt_class": np.array([[0]], np.int32)})
    ops = register_ops()
    out = ops["YOLOv5Mosaic"](img_size=128)(records)
    assert out["image"].shape == (128, 128, 3) and out["bgr"] is True
    out = ops["YOLOv5HSV"](0.0, 0.0, 0.0)(out)
    out = ops["DeviceNormalize"]()([out])[0]   # no HSV gains: the BGR -> RGB swap happens here
    assert "bgr" not in out and out["image"].flags["C_CONTIGUOUS"]


def test_host_normalize_restores_ppdets_ops_for_ppdets_trainer():
    from ppmulti.rank.data.device import host_normalize

    cfg = {"TrainReader": {"batch_transforms": [{"BatchRandomResize": {}}, {"DeviceNormalize": {
        "mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225], "channels_last": True}}, {"PadGT": {}}]}}
    assert host_normalize(cfg)
    assert cfg["TrainReader"]["batch_transforms"] == [
        {"BatchRandomResize": {}},
        {"NormalizeImage": {"mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225], "is_scale": True}},
        {"Permute": {}}, {"PadGT": {}}]
    assert not host_normalize(cfg) and input_norm(cfg) is None


def _hsv_image(seed: int = 0, size: int = 96) -> np.ndarray:
    """A BGR test image: smooth colour ramps (every hue, saturation and value) above uniform noise, with grey."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:size, 0:size] / (size - 1)
    ramps = np.stack([x * 255, y * 255, (1 - x) * (1 - y) * 255], -1)
    noise = rng.integers(0, 256, (size, size, 3))
    grey = np.full((size // 4, size, 3), 114)
    return np.concatenate([ramps, noise, grey]).astype(np.uint8)


def test_hsv_on_the_device_equals_cv2s_on_the_host():
    """YOLOv5's augment_hsv as the device runs it (paddle ops on a BGR batch) against cv2 on the host (LUT and
    conversions), 24 gain draws of hyp.scratch-low plus the identity and extreme gains: every value within 1 of
    cv2's and at most 3% off by 1 (cv2's vectorised HSV-to-RGB truncates its floats; the last bit of a float32
    product decides a few). Grey stays grey."""
    from ppmulti.rank.data import augment as A

    image = _hsv_image()
    rng = np.random.default_rng(1)
    draws = [A.hsv_gains(rng, 0.015, 0.7, 0.4) for _ in range(24)]
    draws += [np.ones(3), np.array([1.015, 1.7, 1.4]), np.array([0.985, 0.3, 0.6]), np.array([1.0, 0.0, 1.0])]
    batch = paddle.to_tensor(np.stack([image.transpose(2, 0, 1)] * len(draws)))
    out = hsv_on_device(batch, paddle.to_tensor(np.stack(draws).astype(np.float32))).numpy()
    for k, gains in enumerate(draws):
        want = A.augment_hsv(image.copy(), gains, rgb=True).astype(int)
        got = out[k].transpose(1, 2, 0).astype(int)
        off = np.abs(got - want)
        assert off.max() <= 1, (gains, off.max())
        assert (off > 0).mean() < 0.03, (gains, (off > 0).mean())
        grey = got[-4:]
        assert (grey.max(-1) == grey.min(-1)).all()


def test_hsv_on_the_device_builds_the_hosts_tables_in_float64():
    """A hue gain whose float32 product a hair below an integer rounds up to it: 174 x 0.9827586 is 170.99999 in
    float64 (cv2's table: 170) and 171.0 in float32. The device takes the host's table, so a saturated pixel of
    hue 174 ends where cv2 puts it (one hue step off moved it by 3-8 of 255: CI, 2026-11-26)."""
    import cv2

    from ppmulti.rank.data import augment as A

    gain = np.float32(0.9827586)
    assert np.floor(np.float32(174) * gain) == 171 and np.floor(174 * np.float64(gain)) == 170
    hsv = np.array([[[174, 255, 255], [174, 200, 230], [90, 255, 255]]], np.uint8)
    bgr = cv2.cvtColor(hsv, cv2.COLOR_HSV2BGR)
    assert (cv2.cvtColor(bgr, cv2.COLOR_BGR2HSV)[0, :2, 0] == 174).all()
    gains = np.array([gain, 1.0, 1.0], np.float32)
    want = A.augment_hsv(bgr.copy(), gains.astype(np.float64), rgb=True).astype(int)
    got = hsv_on_device(paddle.to_tensor(bgr.transpose(2, 0, 1)[None]), paddle.to_tensor(gains[None])).numpy()
    assert np.abs(got[0].transpose(1, 2, 0).astype(int) - want).max() <= 1, (got[0].transpose(1, 2, 0), want)


def test_hsv_gains_on_the_device_give_the_hosts_batches(demo_yaml):
    """The reader as a GPU run builds it (YOLOv5HSV on_device: BGR uint8 and the drawn gains leave the loader,
    the trainer's to_model_input applies them): each image of its batches equals cv2's augment_hsv with the same
    gains on the host within 1/255; and the batch statistics of the whole path (128 images) agree with a CPU
    run's (gains applied in the loader) within the tolerances the YOLOv5 recipe test uses."""
    from ppmulti.rank.data import augment as A

    raw: list = []
    device = _batches(demo_yaml, old=False, n_batches=1, seed=3, device="gpu", raw=raw)
    bgr, gains = raw[0]["image"], raw[0]["hsv_gain"]
    assert bgr.dtype == np.uint8 and bgr.shape[-1] == 3 and gains.shape == (16, 3)
    for k in range(16):
        want = A.augment_hsv(np.ascontiguousarray(bgr[k]), gains[k].astype(np.float64), rgb=True)
        got = device[0][0][k].transpose(1, 2, 0) * 255
        off = np.abs(got - want)
        assert off.max() <= 1 + 1e-3, (k, off.max())
        assert (off > 1e-3).mean() < 0.03
    host = _stats(_batches(demo_yaml, old=False, n_batches=8, seed=0, device="cpu"))
    on_device = _stats(_batches(demo_yaml, old=False, n_batches=8, seed=0, device="gpu"))
    tolerance = {"mean": 0.06, "std": 0.03, "grey": 0.06, "boxes_per_image": 1.2, "box_w": 0.04, "box_h": 0.04}
    print("\nhost", host, "\ndevice", on_device)
    for key, tol in tolerance.items():
        assert abs(host[key] - on_device[key]) < tol, (key, host[key], on_device[key])


def test_hsv_placement_follows_the_training_device():
    """on_device auto: the GPU gets the gains, a CPU run keeps them in the loader; a config's true/false stays;
    ppdet's own Trainer (host_normalize) always gets them on the host."""
    from ppmulti.rank.data.device import host_normalize

    def cfg(value="auto"):
        return {"TrainReader": {"sample_transforms": [{"YOLOv5HSV": {"hgain": 0.015, "on_device": value}}],
                                "batch_transforms": [{"DeviceNormalize": {"channels_last": True}}]}}

    for device, want in (("gpu", True), ("cpu", False)):
        c = cfg()
        assert place_hsv(c, device) is want
        assert c["TrainReader"]["sample_transforms"][0]["YOLOv5HSV"]["on_device"] is want
    assert place_hsv(cfg(True), "cpu") is True
    assert place_hsv(cfg(False), "gpu") is False
    assert place_hsv({"TrainReader": {"sample_transforms": [{"Decode": {}}]}}, "gpu") is None
    c = cfg()
    place_hsv(c, "gpu")
    host_normalize(c)
    assert c["TrainReader"]["sample_transforms"][0]["YOLOv5HSV"]["on_device"] is False
