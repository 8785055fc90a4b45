"""YOLOv5 detect.py's behaviour: one NMS for Paddle and ONNX weights on every frame of a source (images, videos,
streams), label files, crops, a CSV, annotated images and videos."""

from __future__ import annotations

import contextlib
import csv
import logging
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

import numpy as np

from ppmulti.common.errors import UserError
from ppmulti.rank.engine.labels import clip_boxes, label_lines
from ppmulti.rank.engine.sources import Frame

log = logging.getLogger("ppmulti")

MAX_WH = 7680        # class offset for batched NMS: larger than any image side
MAX_NMS = 30000      # candidates kept for NMS, by score (YOLOv5's cap)


# ----------------------------------------------------------------------------- post-processing


@dataclass(frozen=True)
class NmsOptions:
    """YOLOv5's detection filters: confidence, NMS IoU, the classes kept, NMS across classes, detections per image."""

    conf_thres: float = 0.25
    iou_thres: float = 0.45
    classes: tuple[int, ...] | None = None
    agnostic: bool = False
    max_det: int = 1000


def box_iou(box: np.ndarray, boxes: np.ndarray) -> np.ndarray:
    """IoU of one x1y1x2y2 box with each of ``boxes`` [K, 4]."""
    lt = np.maximum(box[:2], boxes[:, :2])
    rb = np.minimum(box[2:], boxes[:, 2:])
    inter = np.prod(np.clip(rb - lt, 0, None), axis=1)
    area = np.prod(box[2:] - box[:2])
    areas = np.prod(boxes[:, 2:] - boxes[:, :2], axis=1)
    return inter / np.maximum(area + areas - inter, 1e-9)


def greedy_nms(boxes: np.ndarray, scores: np.ndarray, iou_thres: float) -> np.ndarray:
    """Indices kept by greedy NMS, highest score first (stable order among equal scores)."""
    order = np.argsort(-scores, kind="stable")
    keep = []
    while order.size:
        i = order[0]
        keep.append(i)
        if order.size == 1:
            break
        rest = order[1:]
        order = rest[box_iou(boxes[i], boxes[rest]) <= iou_thres]
    return np.asarray(keep, dtype=np.int64)


def _finish(dets: np.ndarray, opts: NmsOptions, iou_thres: float | None) -> np.ndarray:
    """Class filter, NMS per class (across classes with ``opts.agnostic``; none when ``iou_thres`` is None),
    the max-det cut; rows x1, y1, x2, y2, conf, cls by falling confidence."""
    if opts.classes is not None:
        dets = dets[np.isin(dets[:, 5].astype(np.int64), np.asarray(opts.classes, dtype=np.int64))]
    dets = dets[np.argsort(-dets[:, 4], kind="stable")][:MAX_NMS]
    if iou_thres is not None and len(dets):
        offset = 0.0 if opts.agnostic else dets[:, 5:6] * MAX_WH
        dets = dets[greedy_nms(dets[:, :4] + offset, dets[:, 4], iou_thres)]
    return dets[:opts.max_det]


def nms_raw(boxes: np.ndarray, scores: np.ndarray, opts: NmsOptions) -> np.ndarray:
    """One image's raw outputs (boxes [N, 4] x1y1x2y2, scores [C, N]) as YOLOv5's detect keeps them: each box's
    best class, confidence above ``conf_thres``, NMS per class (or across classes), at most ``max_det``.
    Rows: x1, y1, x2, y2, conf, cls."""
    cls = scores.argmax(axis=0)
    conf = scores[cls, np.arange(scores.shape[1])]
    keep = conf > opts.conf_thres
    dets = np.concatenate([boxes[keep], conf[keep, None], cls[keep, None].astype(boxes.dtype)], axis=1)
    return _finish(dets.astype(np.float64), opts, opts.iou_thres)


def nms_done(dets: np.ndarray, opts: NmsOptions) -> np.ndarray:
    """Detections from a graph that ran NMS already (rows cls, score, x1, y1, x2, y2): the same filters, and
    a second NMS across classes with ``opts.agnostic`` (the graph's per-class IoU threshold stays as exported)."""
    dets = np.asarray(dets, dtype=np.float64).reshape(-1, 6)
    dets = dets[dets[:, 1] > opts.conf_thres][:, [2, 3, 4, 5, 1, 0]]
    return _finish(dets, opts, opts.iou_thres if opts.agnostic else None)


# ----------------------------------------------------------------------------- drawing


PALETTE = [(255, 56, 56), (255, 157, 151), (255, 112, 31), (255, 178, 29), (207, 210, 49), (72, 249, 10),
           (146, 204, 23), (61, 219, 134), (26, 147, 52), (0, 212, 187), (44, 153, 168), (0, 194, 255),
           (52, 69, 147), (100, 115, 255), (0, 24, 236), (132, 56, 255), (82, 0, 133), (203, 56, 255),
           (255, 149, 200), (255, 55, 199)]


def draw(img, dets: np.ndarray, names: dict[int, str], thickness: int, hide_labels: bool, hide_conf: bool) -> None:
    """Boxes with ``name conf`` labels (or less) drawn onto a PIL image, a colour per class."""
    from PIL import ImageDraw

    pen = ImageDraw.Draw(img)
    for x1, y1, x2, y2, conf, cls in dets:
        color = PALETTE[int(cls) % len(PALETTE)]
        x1, x2, y1, y2 = min(x1, x2), max(x1, x2), min(y1, y2), max(y1, y2)   # a box the model turned inside out
        pen.rectangle([x1, y1, x2, y2], outline=color, width=max(1, thickness))
        if hide_labels:
            continue
        label = names.get(int(cls), str(int(cls))) + ("" if hide_conf else f" {conf:.2f}")
        left, top, right, bottom = pen.textbbox((x1, y1), label)
        th = bottom - top
        above = y1 - th - 3 >= 0
        ty = y1 - th - 3 if above else y1
        pen.rectangle([x1, ty, x1 + (right - left) + 4, ty + th + 3], fill=color)
        pen.text((x1 + 2, ty), label, fill=(255, 255, 255))


# ----------------------------------------------------------------------------- backends


@dataclass
class Prediction:
    """One frame's model outputs: raw (``boxes`` [N, 4], ``scores`` [C, N]) or after NMS (``dets`` [K, 6])."""

    boxes: np.ndarray | None = None
    scores: np.ndarray | None = None
    dets: np.ndarray | None = None


class FrameFeeder:
    """The config's TestReader pre-processing on a decoded frame: its sample transforms after ``Decode`` (the frame
    comes decoded, as ``Decode`` leaves an image: RGB with its size), then its batch transforms, one frame a batch.
    The same arrays as the TestReader makes from an image file."""

    def __init__(self, cfg):
        from ppdet.data.reader import BatchCompose, Compose

        reader = cfg["TestReader"]
        sample = list(reader.get("sample_transforms") or [])
        first = next(iter(sample[0])) if sample else None
        if first != "Decode":
            raise UserError(f"TestReader.sample_transforms starts with {first or 'nothing'}, not Decode: detect feeds "
                            f"decoded frames after Decode; put Decode first in the config")
        num_classes = int(cfg["num_classes"])
        self.sample = Compose(sample[1:], num_classes=num_classes)
        self.batch = BatchCompose(list(reader.get("batch_transforms") or []), num_classes,
                                  bool(reader.get("collate_batch", True)))
        self.count = 0

    def __call__(self, bgr: np.ndarray) -> dict[str, np.ndarray]:
        import cv2

        image = cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)
        height, width = image.shape[:2]
        self.count += 1
        sample = {"im_id": np.array([self.count]), "curr_iter": 0, "image": image, "h": height, "w": width,
                  "im_shape": np.array([height, width], dtype=np.float32),
                  "scale_factor": np.array([1.0, 1.0], dtype=np.float32)}
        return self.batch([self.sample(sample)])


class PaddleBackend:
    """The weights in Paddle, NMS left out of the head so that the same NMS as for ONNX runs after it; an
    end-to-end head (YOLO26's one-to-one branch) has no NMS to leave out, and its rows are taken as they come."""

    def __init__(self, config: str, overrides: list[str], weights: str, edit: Callable[[Any], None]):
        from ppmulti.rank.engine.inference import build_model, leave_nms_out

        self.cfg, self.model = build_model(config, overrides, weights, edit)
        self.end2end = bool(getattr(getattr(self.model, "head", None), "end2end", False))
        if not self.end2end:
            leave_nms_out(self.model)
        self.feed = FrameFeeder(self.cfg)

    def predict(self, bgr: np.ndarray) -> Prediction:
        import paddle

        data = {k: paddle.to_tensor(v) if isinstance(v, np.ndarray) else v for k, v in self.feed(bgr).items()}
        with paddle.no_grad():
            outs = self.model(data)
        if self.end2end:   # rows cls, score, x1, y1, x2, y2, as a graph with NMS inside gives them
            return Prediction(dets=outs["bbox"].numpy()[: int(outs["bbox_num"].numpy()[0])])
        return Prediction(boxes=outs["bbox"].numpy()[0], scores=outs["bbox_num"].numpy()[0])


class OnnxBackend:
    """An exported ONNX file in onnxruntime, fed by the config's own TestReader; reads which outputs it has."""

    def __init__(self, config: str, overrides: list[str], onnx_file: Path, edit: Callable[[Any], None],
                 gpu: bool = False):
        try:
            import onnxruntime
        except ImportError:
            raise UserError(f"--weights {onnx_file}: running ONNX needs onnxruntime: "
                            f'pip install -e ".[export]"') from None
        from ppmulti.rank import config as config_mod

        providers = ["CPUExecutionProvider"]
        if gpu and "CUDAExecutionProvider" in onnxruntime.get_available_providers():
            providers.insert(0, "CUDAExecutionProvider")
        try:
            self.session = onnxruntime.InferenceSession(str(onnx_file), providers=providers)
        except Exception as exc:   # noqa: BLE001 - onnxruntime raises its own types for unreadable files
            raise UserError(f"--weights {onnx_file}: onnxruntime cannot load it: "
                            f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") from None
        image = next((i for i in self.session.get_inputs() if i.name == "image"), None)
        if image is None:
            raise UserError(f"--weights {onnx_file}: no 'image' input; export it with tools/export.py")
        batch, _, height, width = image.shape
        if isinstance(batch, int) and batch != 1:
            raise UserError(f"--weights {onnx_file}: exported for batches of {batch} images; detect feeds one: "
                            f"export with --batch-size 1 or --dynamic")
        self.size = height if isinstance(height, int) and height == width else None
        outputs = self.session.get_outputs()
        self.nms_inside = len(outputs) == 2 and len(outputs[0].shape) == 2
        self.inputs = [i.name for i in self.session.get_inputs()]
        self.cfg = config_mod.load(config, overrides)
        edit(self.cfg)
        self._feed: FrameFeeder | None = None   # built at the first frame: tools/detect.py edits cfg after this

    def feed(self, bgr: np.ndarray) -> dict[str, np.ndarray]:
        if self._feed is None:
            self._feed = FrameFeeder(self.cfg)
        return self._feed(bgr)

    def predict(self, bgr: np.ndarray) -> Prediction:
        data = self.feed(bgr)
        first, second = self.session.run(None, {name: data[name].astype(np.float32) for name in self.inputs})
        return Prediction(dets=first) if self.nms_inside else Prediction(boxes=first[0], scores=second[0])


# ----------------------------------------------------------------------------- the run


@dataclass
class DetectOptions:
    """What to write: annotated images and videos (unless ``nosave``), label files, crops, the CSV, their look."""

    nms: NmsOptions
    save_dir: Path
    save_img: bool = True
    save_txt: bool = False
    save_conf: bool = False
    save_crop: bool = False
    save_csv: bool = False
    line_thickness: int = 3
    hide_labels: bool = False
    hide_conf: bool = False


CSV_NAME = "predictions.csv"
CSV_COLUMNS = ("Image Name", "Prediction", "Confidence")   # YOLOv5's, one row per detection
VIDEO_FOURCC = "mp4v"   # YOLOv5's codec for its .mp4 results
CROP_GAIN, CROP_PAD = 1.02, 10   # YOLOv5's save_one_box: a crop a little larger than its box


def crop_box(bgr: np.ndarray, box) -> np.ndarray:
    """The part of a frame under one x1y1x2y2 box, grown as YOLOv5's save_one_box grows it (sides x1.02 + 10 px),
    kept inside the frame."""
    x1, y1, x2, y2 = (float(v) for v in box[:4])
    cx, cy = (x1 + x2) / 2, (y1 + y2) / 2
    w, h = (x2 - x1) * CROP_GAIN + CROP_PAD, (y2 - y1) * CROP_GAIN + CROP_PAD
    height, width = bgr.shape[:2]
    left, top = min(max(int(cx - w / 2), 0), width), min(max(int(cy - h / 2), 0), height)
    right, bottom = min(max(int(cx + w / 2), 0), width), min(max(int(cy + h / 2), 0), height)
    return bgr[top:bottom, left:right]


class _VideoOut:
    """One annotated video at a time (YOLOv5's vid_writer): NAME.mp4 with the frames' size and the source's rate,
    written as a hidden partial file and renamed when complete, so a crash leaves no half-written NAME.mp4."""

    def __init__(self):
        self.item: str | None = None
        self.writer = None
        self.partial: Path | None = None
        self.final: Path | None = None
        self.written = 0
        self.done: list[tuple[Path, int]] = []

    def write(self, frame: Frame, image: np.ndarray, save_dir: Path) -> None:
        import cv2

        if frame.item != self.item:
            self.close()
            self.item = frame.item
            self.final = save_dir / f"{frame.stem}.mp4"
            self.partial = save_dir / f".{frame.stem}.partial.mp4"
            height, width = image.shape[:2]
            self.writer = cv2.VideoWriter(str(self.partial), cv2.VideoWriter_fourcc(*VIDEO_FOURCC),
                                          frame.fps or 30.0, (width, height))
            if not self.writer.isOpened():
                raise UserError(f"{self.final}: OpenCV cannot write an {VIDEO_FOURCC} .mp4 here; pass --nosave to "
                                f"write labels only")
            self.written = 0
        self.writer.write(image)
        self.written += 1

    def close(self) -> None:
        if self.writer is None:
            return
        self.writer.release()
        self.writer = None
        self.partial.replace(self.final)
        self.done.append((self.final, self.written))


class _Crops:
    """crops/CLASS/NAME.jpg, NAME2.jpg, ... (YOLOv5's increment_path), numbers kept in memory, not re-listed."""

    def __init__(self, root: Path):
        self.root = root
        self.next: dict[Path, int] = {}

    def save(self, bgr: np.ndarray, box, class_name: str, stem: str) -> None:
        from PIL import Image

        crop = crop_box(bgr, box)
        if crop.size == 0:
            return
        base = self.root / class_name / f"{stem}.jpg"
        n = self.next.get(base, 1)
        while True:
            path = base if n == 1 else base.with_name(f"{stem}{n}.jpg")
            if not path.exists():
                break
            n += 1
        self.next[base] = n + 1
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(np.ascontiguousarray(crop[..., ::-1])).save(path, quality=95, subsampling=0)


def class_names(cfg) -> dict[int, str]:
    """Class index -> name, from the config's TestDataset categories (the run's data)."""
    from ppdet.data.source.category import get_categories

    test = dict(cfg.get("TestDataset") or {})
    anno = test.get("anno_path")
    if anno and test.get("dataset_dir") and not Path(anno).is_absolute():
        anno = str(Path(test["dataset_dir"]) / anno)
    clsid2catid, catid2name = get_categories(cfg.metric, anno_file=anno if anno and Path(anno).is_file() else None)
    return {int(c): str(catid2name.get(cat, c)) for c, cat in clsid2catid.items()}


def label_path(labels_dir: Path, frame: Frame) -> Path:
    """YOLOv5's label file: labels/NAME.txt for an image, labels/NAME_FRAME.txt for a video's or a stream's frame."""
    return labels_dir / (f"{frame.stem}.txt" if frame.mode == "image" else f"{frame.stem}_{frame.frame}.txt")


@contextlib.contextmanager
def _whole_frame():
    """Ctrl-C (SIGINT) inside the block is held until its end, then raised: a frame's label, crop, CSV rows, video
    frame and line are written all or none. Reading and inference stay interruptible at once."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    hit = []
    previous = signal.signal(signal.SIGINT, lambda *_: hit.append(True))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if hit:
        raise KeyboardInterrupt


def run_detect(backend, frames: Iterable[Frame], opts: DetectOptions) -> dict:
    """Detect on every frame, write what ``opts`` asks, log one line per frame (YOLOv5's ``image 1/3 ...`` and
    ``video 1/1 (frame 3/30) ...``); Ctrl-C stops it with everything written so far closed and kept. Returns
    counts: images, video frames, stream frames, detections, seconds, videos written [(path, frames)], interrupted."""
    from PIL import Image

    names = class_names(backend.cfg)
    labels_dir = opts.save_dir / "labels"
    if opts.save_txt:
        labels_dir.mkdir(parents=True, exist_ok=True)
    counts = {"image": 0, "video": 0, "stream": 0}
    videos, crops = _VideoOut(), _Crops(opts.save_dir / "crops")
    csv_file = csv_writer = None
    if opts.save_csv:   # appended to, as YOLOv5 does (--exist-ok into an earlier run keeps its rows)
        csv_path = opts.save_dir / CSV_NAME
        fresh = not csv_path.is_file() or csv_path.stat().st_size == 0
        csv_file = open(csv_path, "a", newline="")
        csv_writer = csv.writer(csv_file)
        if fresh:
            csv_writer.writerow(CSV_COLUMNS)
    found, interrupted = 0, False

    def class_of(det) -> str:
        return names.get(int(det[5]), str(int(det[5])))

    tic = t0 = time.time()
    try:
        for frame in frames:
            bgr = frame.image
            height, width = bgr.shape[:2]
            pred = backend.predict(bgr)
            dets = nms_done(pred.dets, opts.nms) if pred.dets is not None else \
                nms_raw(pred.boxes, pred.scores, opts.nms)
            dets = clip_boxes(dets, width, height)
            with _whole_frame():   # a Ctrl-C here waits for the frame's files and line: they stay in step
                found += len(dets)
                counts[frame.mode] += 1
                if opts.save_txt:
                    label = label_path(labels_dir, frame)
                    lines = label_lines(dets, width, height, opts.save_conf)
                    if lines:
                        label.write_text("\n".join(lines) + "\n")
                    elif label.exists():
                        label.unlink()   # --exist-ok into an earlier run: no stale boxes for a frame with none now
                if csv_writer is not None:
                    csv_writer.writerows((frame.name, class_of(d), f"{d[4]:.2f}") for d in dets)
                    csv_file.flush()
                if opts.save_crop:
                    for d in dets:
                        crops.save(bgr, d, class_of(d), frame.stem)
                if opts.save_img:
                    img = Image.fromarray(np.ascontiguousarray(bgr[..., ::-1]))
                    draw(img, dets, names, opts.line_thickness, opts.hide_labels, opts.hide_conf)
                    if frame.mode == "image":
                        img.save(opts.save_dir / frame.name)
                    else:
                        videos.write(frame, np.ascontiguousarray(np.asarray(img)[..., ::-1]), opts.save_dir)
                per_class = np.unique(dets[:, 5].astype(int), return_counts=True) if len(dets) else ([], [])
                what = ", ".join(f"{k} {names.get(int(c), c)}" for c, k in zip(*per_class)) or "(no detections)"
                log.info("%s: %dx%d %s, %.1fms", frame.prefix, width, height, what,
                         (time.time() - t0) * 1000)   # reading, inference, NMS and writing
                t0 = time.time()
    except KeyboardInterrupt:
        interrupted = True
        log.warning("stopped by Ctrl-C after %d frames; what was detected so far is saved", sum(counts.values()))
    finally:
        videos.close()
        if csv_file is not None:
            csv_file.close()
    return {"images": counts["image"], "video_frames": counts["video"], "stream_frames": counts["stream"],
            "detections": found, "seconds": round(time.time() - tic, 3), "videos": videos.done,
            "interrupted": interrupted}
