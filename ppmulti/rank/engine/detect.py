"""YOLOv5 detect.py's behaviour: image sources, one NMS for Paddle and ONNX weights, label files, annotated images."""

from __future__ import annotations

import glob
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from ppmulti.common.errors import UserError
from ppmulti.common.paths import IMAGE_SUFFIXES
from ppmulti.rank.engine.labels import clip_boxes, label_lines

log = logging.getLogger("ppmulti")

VIDEO_SUFFIXES = (".asf", ".avi", ".gif", ".m4v", ".mkv", ".mov", ".mp4", ".mpeg", ".mpg", ".ts", ".wmv")
STREAM_PREFIXES = ("rtsp://", "rtmp://", "http://", "https://")
MAX_WH = 7680        # class offset for batched NMS: larger than any image side
MAX_NMS = 30000      # candidates kept for NMS, by score (YOLOv5's cap)
IMAGES_ONLY = "ppmulti's detect reads image files only (a file, a folder, a glob or a .txt list of paths)"


# ----------------------------------------------------------------------------- sources


def resolve_source(source: str) -> list[Path]:
    """YOLOv5's ``--source`` as a list of images: a file, a folder, a glob, or a .txt file of paths (one per line,
    relative to the current directory or to the list's folder). Webcams, streams, URLs and videos are refused by
    name."""
    text = str(source).strip()
    if text.isnumeric() or text == "screen" or text.lower().endswith(".streams"):
        raise UserError(f"--source {text}: a webcam, screen or stream list; {IMAGES_ONLY}")
    if text.lower().startswith(STREAM_PREFIXES):
        raise UserError(f"--source {text}: a URL or stream; {IMAGES_ONLY} (download the images first)")
    path = Path(text)
    if path.suffix.lower() == ".txt" and path.is_file():
        entries = [line.strip() for line in path.read_text().splitlines() if line.strip()]
        files = [p if p.exists() else path.parent / p for p in map(Path, entries)]
        missing = [str(p) for p in files if not p.is_file()]
        if missing:
            raise UserError(f"--source {text}: {len(missing)} listed paths are not files, e.g. {missing[0]}")
    elif "*" in text or "?" in text:
        files = [Path(p) for p in sorted(glob.glob(text, recursive=True)) if Path(p).is_file()]
    elif path.is_dir():
        files = sorted(p for p in path.iterdir() if p.is_file() and not p.name.startswith("."))
    elif path.is_file():
        files = [path]
    else:
        raise UserError(f"--source {text}: no such file or folder")
    videos = [p for p in files if p.suffix.lower() in VIDEO_SUFFIXES]
    if videos:
        what = f"{videos[0]} and {len(videos) - 1} more are videos" if len(videos) > 1 else f"{videos[0]} is a video"
        raise UserError(f"--source {text}: {what}; {IMAGES_ONLY}")
    images = [p for p in files if p.suffix.lower() in IMAGE_SUFFIXES]
    if not images:
        raise UserError(f"--source {text}: no images ({'/'.join(IMAGE_SUFFIXES)}) found")
    return images


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
    """One image's model outputs: raw (``boxes`` [N, 4], ``scores`` [C, N]) or after NMS (``dets`` [K, 6])."""

    path: Path
    boxes: np.ndarray | None = None
    scores: np.ndarray | None = None
    dets: np.ndarray | None = None


def _feeds(cfg, images: Sequence[Path]) -> Iterator[tuple[Path, dict]]:
    """The images through the config's TestReader, one at a time: (path, batch of arrays and tensors)."""
    from ppdet.core.workspace import create

    dataset = create("TestDataset")()
    dataset.set_images([str(p) for p in images])
    loader = create("TestReader")(dataset, 0)
    imid2path = dataset.get_imid2path()
    for data in loader:
        yield Path(imid2path[int(data["im_id"].numpy().reshape(-1)[0])]), data


class PaddleBackend:
    """The weights in Paddle, NMS left out of the head so that the same NMS as for ONNX runs after it."""

    def __init__(self, config: str, overrides: list[str], weights: str, edit: Callable[[Any], None]):
        from ppmulti.rank.engine.inference import build_model, leave_nms_out

        self.cfg, self.model = build_model(config, overrides, weights, edit)
        leave_nms_out(self.model)

    def predict(self, images: Sequence[Path]) -> Iterator[Prediction]:
        import paddle

        with paddle.no_grad():
            for path, data in _feeds(self.cfg, images):
                outs = self.model(data)
                yield Prediction(path, boxes=outs["bbox"].numpy()[0], scores=outs["bbox_num"].numpy()[0])


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
        self.cfg = config_mod.load(config, overrides)
        edit(self.cfg)

    def predict(self, images: Sequence[Path]) -> Iterator[Prediction]:
        wanted = [i.name for i in self.session.get_inputs()]
        for path, data in _feeds(self.cfg, images):
            feed = {name: data[name].numpy().astype(np.float32) for name in wanted}
            first, second = self.session.run(None, feed)
            if self.nms_inside:
                yield Prediction(path, dets=first)
            else:
                yield Prediction(path, boxes=first[0], scores=second[0])


# ----------------------------------------------------------------------------- the run


@dataclass
class DetectOptions:
    """What to write: annotated images (unless ``nosave``), label files, their look."""

    nms: NmsOptions
    save_dir: Path
    save_img: bool = True
    save_txt: bool = False
    save_conf: bool = False
    line_thickness: int = 3
    hide_labels: bool = False
    hide_conf: bool = False


def class_names(cfg) -> dict[int, str]:
    """Class index -> name, from the config's TestDataset categories (the run's data)."""
    from ppdet.data.source.category import get_categories

    test = dict(cfg.get("TestDataset") or {})
    anno = test.get("anno_path")
    if anno and test.get("dataset_dir") and not Path(anno).is_absolute():
        anno = str(Path(test["dataset_dir"]) / anno)
    clsid2catid, catid2name = get_categories(cfg.metric, anno_file=anno if anno and Path(anno).is_file() else None)
    return {int(c): str(catid2name.get(cat, c)) for c, cat in clsid2catid.items()}


def run_detect(backend, images: Sequence[Path], opts: DetectOptions) -> dict:
    """Detect on every image, write what ``opts`` asks, log one line per image; returns counts."""
    from PIL import Image

    names = class_names(backend.cfg)
    labels_dir = opts.save_dir / "labels"
    if opts.save_txt:
        labels_dir.mkdir(parents=True, exist_ok=True)
    total = len(images)
    tic = time.time()
    found = 0
    t0 = time.time()
    for n, pred in enumerate(backend.predict(images), 1):
        img = Image.open(pred.path).convert("RGB")
        width, height = img.size
        dets = nms_done(pred.dets, opts.nms) if pred.dets is not None else nms_raw(pred.boxes, pred.scores, opts.nms)
        dets = clip_boxes(dets, width, height)
        found += len(dets)
        if opts.save_txt:
            label = labels_dir / f"{pred.path.stem}.txt"
            lines = label_lines(dets, width, height, opts.save_conf)
            if lines:
                label.write_text("\n".join(lines) + "\n")
            elif label.exists():
                label.unlink()   # --exist-ok into an earlier run: no stale boxes for an image with none now
        if opts.save_img:
            draw(img, dets, names, opts.line_thickness, opts.hide_labels, opts.hide_conf)
            img.save(opts.save_dir / pred.path.name)
        counts = np.unique(dets[:, 5].astype(int), return_counts=True) if len(dets) else ([], [])
        what = ", ".join(f"{k} {names.get(int(c), c)}" for c, k in zip(*counts)) or "(no detections)"
        log.info("image %d/%d %s: %dx%d %s, %.1fms", n, total, pred.path, width, height, what,
                 (time.time() - t0) * 1000)   # reading, inference, NMS and writing
        t0 = time.time()
    return {"images": total, "detections": found, "seconds": round(time.time() - tic, 3)}
