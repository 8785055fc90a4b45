"""YOLOv5's training pipeline as ppdet operators (registered into ppdet's op registry): mosaic + random affine
fed by an ImageStore and a bounded buffer of recently loaded images, HSV gains (on the host, or drawn here and
applied on a GPU), flips, and the marker that sends the uint8 batch to the device as it is (float conversion,
mean/std and the channel permute happen there).

Ops (ppdet YAML names): ``YOLOv5Mosaic``, ``YOLOv5HSV``, ``YOLOv5Flip``, ``ChannelsFirst`` (sample transforms)
and ``DeviceNormalize`` (a batch transform). The image functions are in ``ppmulti.rank.data.augment``.

Where the images come from: a dataset that hands ``{'_source': dataset, '_index': i}`` (ppmulti's YOLODataSet
does when its pipeline starts with YOLOv5Mosaic) is read through ``dataset.image_store(size)`` by index;
any other ppdet dataset (COCODataSet, ...) hands plain records (``mosaic_epoch: 0`` makes it 5 of them), and
the images are decoded from their ``im_file``.
"""

from __future__ import annotations

import os
import random
from collections import OrderedDict

import numpy as np

from ppmulti.rank.data import augment as A
from ppmulti.rank.data.images import decode

_REGISTERED: dict = {}


def _single_threaded_cv2() -> None:
    """cv2's own thread pool, once per process: loader workers are already one process per core, and cv2's
    threads would compete with them (and with the training threads when worker_num is 0)."""
    pid = os.getpid()
    if _REGISTERED.get("cv2_pid") != pid:
        import cv2

        cv2.setNumThreads(0)
        _REGISTERED["cv2_pid"] = pid


def _tile(record: dict, image: np.ndarray, orig_hw) -> A.Tile:
    boxes = np.asarray(record.get("gt_bbox", np.zeros((0, 4))), np.float64).reshape(-1, 4)
    classes = np.asarray(record.get("gt_class", np.zeros((0, 1))), np.int32).reshape(-1, 1)
    h, w = image.shape[:2]
    if len(boxes) and (h, w) != tuple(orig_hw):
        boxes = boxes * [w / orig_hw[1], h / orig_hw[0], w / orig_hw[1], h / orig_hw[0]]
    return A.Tile(image, boxes, classes)


def _ops():
    from ppdet.data.transform.operators import BaseOperator, register_op

    class YOLOv5Mosaic(BaseOperator):
        """Load an image (and 3 more) and draw YOLOv5's mosaic + random affine (or, when no mosaic is drawn,
        its letterbox + random affine) as one warp per tile; BGR uint8 out with the boxes in its pixels.

        ``prob`` is YOLOv5's hyp ``mosaic``; degrees, translate, scale, shear, perspective and mixup are its
        hyp values, same meaning. A mosaic's 3 extra tiles are drawn as YOLOv5 draws them: any image of the
        whole training set, each loaded (from --cache when there is one). ``buffer`` N > 0 draws them instead
        from the last N images this loader process loaded (as ultralytics' newer dataset does): about one load
        per image instead of four, at most N images of img_size x img_size x 3 bytes kept per loader process
        (79 MB for 64 at 640 px); 2 ranks trained that way ended at a lower mAP (bench/results/rank_gap.md,
        time_to_accuracy_mosaic.json), as every rank's mosaics then mix only its own shard's recent images.
        """

        uses_source = True   # YOLODataSet hands this op its store and an index instead of a record

        def __init__(self, img_size=640, prob=1.0, degrees=0.0, translate=0.1, scale=0.5, shear=0.0,
                     perspective=0.0, mixup=0.0, buffer=0, rect=False, stride=32):
            super().__init__()
            self.img_size = int(img_size)
            self.prob, self.mixup = float(prob), float(mixup)
            self.hyp = A.AffineHyp(float(degrees), float(translate), float(scale), float(shear), float(perspective))
            self.buffer_size = max(0, int(buffer))
            self.rect, self.stride = bool(rect), int(stride)
            self._buffer: OrderedDict = OrderedDict()
            self._stores: dict = {}
            # ultralytics' close_mosaic: from this epoch on (the dataset's, set in every loader worker) no
            # mosaic and no mixup, the letterbox + affine path only; set by hooks.close_mosaic, None: never
            self.close_from: int | None = None

        # -------------------------------------------------------------- loading
        def _store(self, source):
            key = id(source)
            if key not in self._stores:
                self._stores = {key: source.image_store(self.img_size)}
            return self._stores[key]

        def _load(self, source, index: int | None, record: dict) -> A.Tile:
            key = (id(source), index) if source is not None else record.get("im_file")
            if key in self._buffer:
                self._buffer.move_to_end(key)
                return self._buffer[key]
            if source is not None:
                loaded = self._store(source).load(index)
            else:
                loaded = decode(record["im_file"], self.img_size)
            tile = _tile(record, loaded.image, loaded.orig_hw)
            if not self.buffer_size:
                return tile
            self._buffer[key] = tile
            while len(self._buffer) > self.buffer_size:
                self._buffer.popitem(last=False)
            return tile

        def _extras(self, source, records: list[dict], k: int) -> list[A.Tile]:
            """k more tiles: from the buffer once it holds a few images, else loaded (random indices over the
            whole set, or the extra records a plain ppdet dataset handed over)."""
            if self.buffer_size and len(self._buffer) >= min(self.buffer_size, 8):
                return random.choices(list(self._buffer.values()), k=k)
            if source is not None:
                n = len(source.roidbs)
                picks = [random.randrange(n) for _ in range(k)]
                return [self._load(source, j, source.roidbs[j]) for j in picks]
            extra = records[1:1 + k] or [records[0]]
            return [self._load(None, None, extra[i % len(extra)]) for i in range(k)]

        # -------------------------------------------------------------- drawing
        def _mosaic(self, first: A.Tile, others: list[A.Tile]):
            tiles = [first, *others]
            random.shuffle(tiles)   # YOLOv5 shuffles the own image among the four corners
            return A.mosaic(tiles, self.img_size, self.hyp, np.random)

        def __call__(self, sample, context=None):
            _single_threaded_cv2()
            if isinstance(sample, dict) and "_source" in sample:
                source, index = sample.pop("_source"), int(sample.pop("_index"))
                record = source.roidbs[index]
                records = [record]
                shape = source.rect_shape(index, self.img_size, self.stride) if self.rect else None
            else:
                records = list(sample) if isinstance(sample, (list, tuple)) else [sample]
                source, index, record, shape = None, None, records[0], None
            first = self._load(source, index, record)
            closed = self.close_from is not None and int(getattr(source, "_epoch", 0) or 0) >= self.close_from
            if not self.rect and not closed and random.random() < self.prob:
                image, boxes, classes = self._mosaic(first, self._extras(source, records, 3))
                if random.random() < self.mixup:
                    other = self._extras(source, records, 4)
                    image, boxes, classes = A.mixup(np.random, (image, boxes, classes),
                                                    self._mosaic(other[0], other[1:]))
            else:
                size = tuple(shape) if shape is not None else (self.img_size, self.img_size)
                image, boxes, classes = A.letterbox_affine(first, size, self.hyp, np.random)
            h, w = image.shape[:2]
            out = {k: v for k, v in record.items() if k in ("im_id", "curr_iter")}
            if isinstance(sample, dict) and "curr_iter" in sample:
                out["curr_iter"] = sample["curr_iter"]
            out.update({"image": image, "bgr": True, "gt_bbox": boxes, "gt_class": classes,
                        "im_shape": np.array([h, w], np.float32), "scale_factor": np.ones(2, np.float32),
                        "h": float(h), "w": float(w)})
            if "is_crowd" in record:
                out["is_crowd"] = np.zeros((len(boxes), 1), np.int32)
            return out

    class YOLOv5HSV(BaseOperator):
        """YOLOv5's augment_hsv: H, S and V multiplied by 1 + U(-1, 1) x hgain/sgain/vgain (hyp hsv_h/s/v);
        hands on RGB (the channel swap comes free with the conversion back).

        ``on_device``: true leaves the pixels BGR and hands the drawn gains on as ``hsv_gain``; the trainer
        applies them on the device (``device.hsv_on_device``), after the flips, which do not change colours.
        ``auto`` (the YOLOv5 reader's) is resolved by the trainer: the device on a GPU, the host on a CPU
        (``device.place_hsv``); read here, auto means the host."""

        def __init__(self, hgain=0.015, sgain=0.7, vgain=0.4, on_device=False):
            super().__init__()
            self.gains = (float(hgain), float(sgain), float(vgain))
            self.on_device = on_device is True or str(on_device).lower() == "true"

        def apply(self, sample, context=None):
            image = sample["image"]
            bgr = sample.get("bgr", False)
            if not any(self.gains):
                return sample   # DeviceNormalize swaps to RGB if still BGR
            if not bgr:   # an RGB image (ppdet's Decode): the same gains through the RGB conversions
                import cv2

                image = cv2.cvtColor(np.ascontiguousarray(image), cv2.COLOR_RGB2BGR)
            gains = A.hsv_gains(np.random, *self.gains)
            if self.on_device:
                sample["image"], sample["bgr"] = image, True
                sample["hsv_gain"] = gains.astype(np.float32)
                return sample
            sample["image"] = A.augment_hsv(np.ascontiguousarray(image), gains, rgb=True)
            sample["bgr"] = False
            return sample

    class YOLOv5Flip(BaseOperator):
        """YOLOv5's flips: left-right with probability ``fliplr``, up-down with ``flipud`` (hyp fliplr/flipud)."""

        def __init__(self, fliplr=0.5, flipud=0.0):
            super().__init__()
            self.fliplr, self.flipud = float(fliplr), float(flipud)

        def apply(self, sample, context=None):
            boxes = np.asarray(sample.get("gt_bbox", np.zeros((0, 4), np.float32)))
            if random.random() < self.flipud:
                sample["image"], boxes = A.flip_ud(sample["image"], boxes)
            if random.random() < self.fliplr:
                sample["image"], boxes = A.flip_lr(sample["image"], boxes)
            if "gt_bbox" in sample:
                sample["gt_bbox"] = boxes.astype(np.float32)
            return sample

    class ChannelsFirst(BaseOperator):
        """The image as contiguous RGB 3 x h x w uint8 (one copy). Not in the YOLOv5 reader: there the batch
        leaves as N x h x w x 3 and the device permutes it (a host-side transpose costs a copy per image)."""

        def apply(self, sample, context=None):
            sample["image"] = A.to_chw(sample["image"], swap_rb=bool(sample.pop("bgr", False)))
            return sample

    class DeviceNormalize(BaseOperator):
        """A batch transform that leaves uint8 images as they are: the trainer divides by 255, applies
        ``mean``/``std`` (0-1 units, as NormalizeImage's with is_scale) and, with ``channels_last``, permutes
        N x h x w x 3 to N x 3 x h x w, on the device (``ppmulti.rank.data.device.to_model_input``).
        A sample still marked BGR (no YOLOv5HSV before) is turned to RGB here, unless it carries ``hsv_gain``:
        then the device applies the gains and swaps the channels."""

        def __init__(self, mean=(0.0, 0.0, 0.0), std=(1.0, 1.0, 1.0), channels_last=False):
            super().__init__()
            self.mean, self.std = [float(v) for v in mean], [float(v) for v in std]
            self.channels_last = bool(channels_last)

        def __call__(self, samples, context=None):
            for sample in samples:
                if sample.pop("bgr", False) and "hsv_gain" not in sample:
                    sample["image"] = np.ascontiguousarray(sample["image"][:, :, ::-1])
            return samples

    class RectLetterbox(BaseOperator):
        """ultralytics' val letterbox (``augment.val_letterbox``) of a decoded image into the ``rect_shape`` its
        record carries (YOLODataSet with ``rect`` and ``rect_size``): ``scale_factor`` is the content's gain,
        ``pad_offset`` its (top, left) margin and ``orig_shape`` the image's (h, w), which UltraYOLO's
        post-processing takes back off the boxes before it clips them to the image."""

        def __init__(self, img_size=640, fill_value=114):
            super().__init__()
            self.img_size, self.fill_value = int(img_size), int(fill_value)

        def apply(self, sample, context=None):
            image = sample["image"]
            shape = tuple(int(v) for v in sample.pop("rect_shape", (self.img_size, self.img_size)))
            out, gain, offset = A.val_letterbox(image, self.img_size, shape, self.fill_value)
            sample["orig_shape"] = np.array(image.shape[:2], np.float32)
            sample["image"] = out
            sample["im_shape"] = np.array(out.shape[:2], np.float32)
            sample["scale_factor"] = np.array(gain, np.float32)
            sample["pad_offset"] = np.array(offset, np.float32)
            return sample

    classes = (YOLOv5Mosaic, YOLOv5HSV, YOLOv5Flip, ChannelsFirst, DeviceNormalize, RectLetterbox)
    return {cls.__name__: register_op(cls) for cls in classes}


def register_ops() -> dict:
    """Register the ops with ppdet (once per process) and return them by name."""
    if "ops" not in _REGISTERED:
        import ppdet.data.transform as transform
        from ppdet.data.transform import operators

        ops = _ops()
        for name, cls in ops.items():
            setattr(operators, name, cls)
            setattr(transform, name, cls)   # ppdet's Compose looks op names up in ppdet.data.transform
        _REGISTERED["ops"] = ops
    return _REGISTERED["ops"]


def uses_source(transform) -> bool:
    """Whether a ppdet Compose starts with an op that reads images from the dataset's store itself."""
    ops = getattr(transform, "transforms_cls", None) or []
    return bool(ops) and getattr(ops[0], "uses_source", False)
