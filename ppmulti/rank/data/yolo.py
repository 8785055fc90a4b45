"""YOLOv5-format datasets: the data yaml, label files checked line by line, and a ppdet dataset source."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ppmulti.common.errors import UserError, first_line
from ppmulti.common.paths import IMAGE_SUFFIXES
from ppmulti.rank.data.images import EXIF_ORIENTATION, MIN_IMAGE_SIDE, image_size  # noqa: F401  (re-exported)

log = logging.getLogger("ppmulti")

TRAIN_FIELDS = ["image", "gt_bbox", "gt_class", "is_crowd"]


# ----------------------------------------------------------------------------- the data yaml
@dataclass
class DataSpec:
    """A parsed YOLOv5 data yaml: the root, the split entries (paths resolved) and the class names."""

    yaml_path: Path
    root: Path
    splits: dict[str, list[Path]]
    names: list[str]

    @property
    def nc(self) -> int:
        return len(self.names)


def _names(raw: dict, where: Path) -> list[str]:
    names, nc = raw.get("names"), raw.get("nc")
    if nc is not None and (not isinstance(nc, int) or isinstance(nc, bool) or nc < 1):
        raise UserError(f"{where}: nc must be a positive integer, got {nc!r}")
    if isinstance(names, dict):
        keys = sorted(names)
        if keys != list(range(len(keys))):
            raise UserError(f"{where}: names as a mapping must have the keys 0..{len(keys) - 1}, got {keys[:6]}")
        names = [names[k] for k in keys]
    elif names is None:
        if nc is None:
            raise UserError(f"{where}: give the classes as names: [a, b, ...] (and/or nc: N)")
        names = [f"class{i}" for i in range(nc)]
    elif not isinstance(names, list):
        raise UserError(f"{where}: names must be a list or a mapping {{0: name, ...}}, got {type(names).__name__}")
    names = [str(n) for n in names]
    if nc is not None and nc != len(names):
        raise UserError(f"{where}: nc: {nc} but names lists {len(names)} classes; make them agree")
    if not names:
        raise UserError(f"{where}: names is empty; list the class names")
    return names


def _root(raw: dict, yaml_path: Path) -> Path:
    """YOLOv5 resolves a relative ``path`` against its own checkout; here it is the data yaml's directory,
    or the working directory when only that exists. No ``path`` means the yaml's directory."""
    given = raw.get("path")
    if given in (None, ""):
        return yaml_path.parent.resolve()
    p = Path(os.path.expanduser(str(given)))
    if p.is_absolute():
        return p
    beside = (yaml_path.parent / p).resolve()
    if not beside.exists() and p.resolve().exists():
        return p.resolve()
    return beside


def load_data_yaml(path: str | os.PathLike) -> DataSpec:
    """Parse and check a YOLOv5 dataset yaml (``path/train/val/test/nc/names``); UserError names what is wrong."""
    import yaml

    yaml_path = Path(path)
    if not yaml_path.is_file():
        raise UserError(f"data yaml not found: {yaml_path} (pass --data with a YOLOv5 dataset yaml, "
                        f"e.g. the data.yaml that `ppmulti data demo DIR --format yolo` writes)")
    try:
        raw = yaml.safe_load(yaml_path.read_text())
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise UserError(f"data yaml {yaml_path} is not valid YAML: {first_line(exc)}") from None
    if not isinstance(raw, dict):
        raise UserError(f"data yaml {yaml_path} must be a mapping with train, val and names; got {type(raw).__name__}")
    names = _names(raw, yaml_path)
    root = _root(raw, yaml_path)
    splits: dict[str, list[Path]] = {}
    for split in ("train", "val", "test"):
        entries = raw.get(split)
        if entries in (None, "", []):
            continue
        if isinstance(entries, (str, os.PathLike)):
            entries = [entries]
        if not isinstance(entries, list) or not all(isinstance(e, (str, os.PathLike)) for e in entries):
            raise UserError(f"{yaml_path}: {split} must be a path or a list of paths, got {entries!r}")
        splits[split] = [p if p.is_absolute() else root / p for p in (Path(os.path.expanduser(str(e)))
                                                                       for e in entries)]
    if "train" not in splits and "val" not in splits:
        raise UserError(f"{yaml_path}: no train or val split; add e.g. train: images/train and val: images/val")
    return DataSpec(yaml_path.resolve(), root, splits, names)


# a split's listing, kept for this process while the directories and lists it came from are unchanged: a
# training start lists its splits three times (config check, dataset check, scan), 1.7 s each at 128,000 images
_LISTINGS: dict[tuple, tuple[list[str], list[tuple[str, int]]]] = {}


def _mtime(path: str) -> int:
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return -1


def image_names(spec: DataSpec, split: str) -> list[str]:
    """The images of a split, as strings (Path objects cost seconds at 100,000 images): directories are searched
    recursively, .txt files list one image per line."""
    if split not in spec.splits:
        raise UserError(f"{spec.yaml_path}: no {split} split; add {split}: <directory, list or .txt of images>")
    key = (str(spec.yaml_path), split, tuple(str(e) for e in spec.splits[split]))
    kept = _LISTINGS.get(key)
    if kept is not None and all(_mtime(path) == stamp for path, stamp in kept[1]):
        return list(kept[0])
    files: list[str] = []
    stamps: list[tuple[str, int]] = []   # every directory walked and list read, with its mtime
    for entry in spec.splits[split]:
        if entry.is_dir():
            files += _images_under(entry, stamps)
        elif entry.is_file() and entry.suffix.lower() == ".txt":
            stamps.append((str(entry), _mtime(str(entry))))
            for line in entry.read_text().splitlines():
                line = line.strip()
                if line:
                    files.append(os.path.normpath(line if os.path.isabs(line) else os.path.join(entry.parent, line)))
        elif entry.is_file() and entry.suffix.lower() in IMAGE_SUFFIXES:
            files.append(str(entry))
        else:
            raise UserError(f"{spec.yaml_path}: {split} entry {entry} does not exist (the yaml's path is "
                            f"{spec.root}); ppmulti downloads nothing, fetch the dataset first")
    if not files:
        raise UserError(f"{spec.yaml_path}: {split} holds no images ({'/'.join(IMAGE_SUFFIXES)})")
    _LISTINGS[key] = (files, stamps)
    return list(files)


def _images_under(directory: Path, stamps: list[tuple[str, int]]) -> list[str]:
    """Every image below ``directory``, in the order of their path components (as sorting Paths gives): os.walk
    is several times faster than Path.rglob on a folder of 100,000 images. Each directory's mtime goes to
    ``stamps`` (a file added or removed changes it)."""
    found = []
    for dirpath, _dirs, names in os.walk(directory, followlinks=True):
        stamps.append((dirpath, _mtime(dirpath)))
        found += [os.path.join(dirpath, n) for n in names if os.path.splitext(n)[1].lower() in IMAGE_SUFFIXES]
    found.sort(key=lambda p: p.split(os.sep))
    return found


def label_path(image: str | os.PathLike) -> Path:
    """YOLOv5's rule: the last ``images`` directory of the path becomes ``labels``, the suffix ``.txt``."""
    return Path(label_name(os.fspath(image)))


def label_name(text: str) -> str:
    """``label_path`` on a string (string operations: 100,000 images at every start)."""
    sep = os.sep
    mark = f"{sep}images{sep}"
    i = text.rfind(mark)
    if i >= 0:
        text = f"{text[:i]}{sep}labels{sep}{text[i + len(mark):]}"
    elif text.startswith(f"images{sep}"):
        text = f"labels{sep}{text[len(mark) - 1:]}"
    return os.path.splitext(text)[0] + ".txt"


# ----------------------------------------------------------------------------- labels and images
@dataclass
class LabelNotes:
    """What reading one label file repaired: boxes clipped to the image, dropped, duplicated."""

    clipped: int = 0
    dropped: int = 0
    duplicates: int = 0


def _bad_line(path: Path, lineno: int, line: str, why: str) -> UserError:
    return UserError(f"{path}:{lineno}: {why} in label line {line.strip()!r}; each line is "
                     f"'class x_center y_center width height', normalised to 0-1")


def read_labels(path: Path, nc: int, single_cls: bool = False) -> tuple[np.ndarray, LabelNotes]:
    """A label file as rows (class, x1, y1, x2, y2), normalised; no file or an empty one is a background image.

    Polygon lines (class x1 y1 x2 y2 ...) become their bounding box, as YOLOv5 does. A class id >= nc or a
    malformed line stops with the file and line named; boxes reaching outside the image are clipped.
    """
    notes = LabelNotes()
    try:
        text = path.read_text(errors="replace")
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        return np.zeros((0, 5), np.float32), notes
    fast = _read_boxes_fast(text, nc, single_cls)
    if fast is not None:
        return fast
    rows = []
    for lineno, line in enumerate(text.splitlines(), 1):
        fields = line.split()
        if not fields:
            continue
        if len(fields) != 5 and (len(fields) < 7 or len(fields) % 2 == 0):
            raise _bad_line(path, lineno, line, f"{len(fields)} values")
        try:
            values = [float(v) for v in fields]
        except ValueError:
            raise _bad_line(path, lineno, line, "a value that is not a number") from None
        if not all(np.isfinite(values)):
            raise _bad_line(path, lineno, line, "a value that is not finite")
        cls = values[0]
        if cls < 0 or cls != int(cls):
            raise _bad_line(path, lineno, line, f"class {fields[0]} that is not a non-negative integer")
        if int(cls) >= nc:
            raise UserError(f"{path}:{lineno}: class id {int(cls)} but the data yaml declares nc={nc} "
                            f"(classes 0..{nc - 1}); fix the label or the yaml's names/nc")
        if len(fields) == 5:
            cx, cy, w, h = values[1:]
            if w < 0 or h < 0:
                raise _bad_line(path, lineno, line, "a negative width or height")
            box = [cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2]
        else:
            xs, ys = values[1::2], values[2::2]
            box = [min(xs), min(ys), max(xs), max(ys)]
        clipped = [min(max(v, 0.0), 1.0) for v in box]
        if clipped != box:
            notes.clipped += 1
        if clipped[2] - clipped[0] <= 0 or clipped[3] - clipped[1] <= 0:
            notes.dropped += 1
            continue
        rows.append([0.0 if single_cls else float(int(cls)), *clipped])
    return _dedupe(np.asarray(rows, np.float32).reshape(-1, 5), notes)


def _dedupe(arr: np.ndarray, notes: LabelNotes) -> tuple[np.ndarray, LabelNotes]:
    """Drop repeated rows, keeping the file's order of the first ones."""
    if len(arr) > 1:
        first = list(dict.fromkeys(map(tuple, arr.tolist())).keys())
        notes.duplicates = len(arr) - len(first)
        if notes.duplicates:
            arr = np.asarray(first, np.float32).reshape(-1, 5)
    return arr, notes


def _read_boxes_fast(text: str, nc: int, single_cls: bool) -> tuple[np.ndarray, LabelNotes] | None:
    """``read_labels`` for the common file (every line 'class cx cy w h', all valid) in a few array operations;
    None for anything else, which the line-by-line reader then handles (and names the bad line)."""
    fields = [line.split() for line in text.splitlines()]
    fields = [f for f in fields if f]
    notes = LabelNotes()
    if not fields:
        return np.zeros((0, 5), np.float32), notes
    if any(len(f) != 5 for f in fields):
        return None
    try:
        v = np.array(fields, np.float64)
    except ValueError:
        return None
    cls, cx, cy, w, h = v.T
    if (not np.isfinite(v).all() or (cls < 0).any() or (cls != np.floor(cls)).any() or (cls >= nc).any()
            or (w < 0).any() or (h < 0).any()):
        return None
    box = np.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], 1)
    clipped = np.clip(box, 0.0, 1.0)
    notes.clipped = int((clipped != box).any(1).sum())
    keep = (clipped[:, 2] - clipped[:, 0] > 0) & (clipped[:, 3] - clipped[:, 1] > 0)
    notes.dropped = int((~keep).sum())
    out = np.concatenate([np.zeros((len(v), 1)) if single_cls else cls[:, None], clipped], 1)[keep]
    return _dedupe(out.astype(np.float32).reshape(-1, 5), notes)


@dataclass
class ScanReport:
    """What loading one split found, for the one-line summary and the tests."""

    images: int = 0
    boxes: int = 0
    background: int = 0
    corrupt: list[tuple[str, str]] = field(default_factory=list)
    clipped: int = 0
    dropped: int = 0
    duplicates: int = 0

    def line(self, split: str) -> str:
        text = (f"{split}: {self.images} images, {self.boxes} boxes, {self.background} background, "
                f"{len(self.corrupt)} corrupt skipped")
        if self.clipped or self.dropped or self.duplicates:
            text += (f"; {self.clipped} boxes clipped to the image, {self.dropped} empty boxes dropped, "
                     f"{self.duplicates} duplicate boxes removed")
        return text


def scan_threads() -> int:
    """Threads for the first scan, YOLOv5's rule (one core left free, at most 8): the header and label parsing is
    Python holding the GIL, so threads only pay where the files wait on storage; on 2 cores one thread scanned
    12,800 images in 3.2-3.5 s, two in 4.1-4.4 s and eight in 5.8 s (2026-11-25, warm page cache)."""
    return max(1, min(8, (os.cpu_count() or 1) - 1))


def scan_files(files: Sequence[str | os.PathLike], nc: int, single_cls: bool = False,
               threads: int | None = None) -> dict[str, np.ndarray]:
    """Open every image header and label file: the scan as arrays (what the scan cache stores).

    ``status`` is "" for a usable image, else why not; ``wh`` its size; ``counts`` its label rows, stacked in
    ``labels``; ``notes`` what reading its labels repaired (clipped, dropped, duplicates).
    """
    def one(path):
        size = image_size(path)
        if isinstance(size, str):
            return size, (0, 0), np.zeros((0, 5), np.float32), LabelNotes()
        labels, notes = read_labels(label_path(path), nc, single_cls)
        return "", size, labels, notes

    threads = scan_threads() if threads is None else max(1, threads)
    if threads == 1:
        results = [one(path) for path in files]
    else:
        with ThreadPoolExecutor(threads) as pool:
            results = list(pool.map(one, files))
    n = len(files)
    labels = [r[2] for r in results]
    return {
        "files": np.array([str(p) for p in files], dtype=str).reshape(n),
        "status": np.array([r[0] for r in results], dtype=str).reshape(n),
        "wh": np.array([r[1] for r in results], np.int64).reshape(n, 2),
        "counts": np.array([len(lb) for lb in labels], np.int64).reshape(n),
        "labels": (np.concatenate(labels) if labels else np.zeros((0, 5))).astype(np.float32).reshape(-1, 5),
        "notes": np.array([(r[3].clipped, r[3].dropped, r[3].duplicates) for r in results],
                          np.int64).reshape(n, 3),
    }


def scan(spec: DataSpec, split: str, single_cls: bool = False, threads: int | None = None,
         use_cache: bool = True) -> tuple[list[dict], ScanReport]:
    """ppdet records (im_file, im_id, h, w, gt_bbox in pixels, gt_class, is_crowd) for one split.

    The files are opened once per node: the result is kept in a scan cache (``labels/<split>.ppmulti.cache``)
    that later starts and the other ranks read while every image and label has its recorded size and mtime.
    """
    from ppmulti.rank.data.cache import cached_scan

    files = image_names(spec, split)

    def compute() -> dict[str, np.ndarray]:
        return scan_files(files, spec.nc, single_cls, threads)

    if use_cache:
        arrays, how = cached_scan(files, [label_name(p) for p in files], f"nc={spec.nc}|single={single_cls}",
                                  compute)
        log.debug("%s: %s", split, how)
    else:
        arrays = compute()
    records, report = [], ScanReport()
    offsets = np.concatenate([[0], np.cumsum(arrays["counts"])])
    for i, path in enumerate(files):
        status = str(arrays["status"][i])
        if status:
            report.corrupt.append((str(path), status))
            continue
        w, h = (int(v) for v in arrays["wh"][i])
        labels = arrays["labels"][offsets[i]:offsets[i + 1]]
        n = len(labels)
        boxes = labels[:, 1:] * np.array([w, h, w, h], np.float32)
        records.append({
            "im_file": path, "im_id": np.array([len(records)]), "h": float(h), "w": float(w),
            "gt_bbox": boxes.astype(np.float32).reshape(n, 4),
            "gt_class": labels[:, :1].astype(np.int32).reshape(n, 1),
            "is_crowd": np.zeros((n, 1), np.int32),
        })
        clipped, dropped, duplicates = (int(v) for v in arrays["notes"][i])
        report.boxes += n
        report.background += n == 0
        report.clipped += clipped
        report.dropped += dropped
        report.duplicates += duplicates
    report.images = len(records)
    if report.corrupt:
        shown = ", ".join(f"{p} ({why})" for p, why in report.corrupt[:3])
        log.warning("%s: skipped %d unusable image(s): %s%s", split, len(report.corrupt), shown,
                    " ..." if len(report.corrupt) > 3 else "")
    if not records:
        raise UserError(f"{spec.yaml_path}: every image of the {split} split is unusable "
                        f"(e.g. {report.corrupt[0][0]}: {report.corrupt[0][1]})")
    if report.clipped or report.dropped or report.duplicates:
        log.warning("%s", report.line(split))
    else:
        log.info("%s", report.line(split))
    if report.boxes == 0:
        log.warning("%s", no_boxes_line(split, report.images, records[0]["im_file"]))
    return records, report


def no_boxes_line(split: str, images: int, first_image: str) -> str:
    """The warning for a split without a single box (every label file empty or missing), YOLOv5's 'no labels
    found' in one line with what to check."""
    return (f"{split}: none of the {images} images has a box (every label file is empty or missing): the model "
            f"would learn that nothing is ever there; check that each image has its label file, e.g. "
            f"{first_image} -> {label_name(first_image)}, with lines 'class x_center y_center width height'")


# ----------------------------------------------------------------------------- COCO json for evaluation
def coco_json(records: list[dict], names: list[str]) -> dict:
    """The records as a COCO ground truth (category id = class id + 1) for pycocotools."""
    images, annotations = [], []
    for rec in records:
        im_id = int(rec["im_id"][0])
        images.append({"id": im_id, "file_name": rec["im_file"], "width": int(rec["w"]), "height": int(rec["h"])})
        for box, cls in zip(rec["gt_bbox"], rec["gt_class"][:, 0]):
            x1, y1, x2, y2 = (float(v) for v in box)
            annotations.append({"id": len(annotations) + 1, "image_id": im_id, "category_id": int(cls) + 1,
                                "bbox": [x1, y1, x2 - x1, y2 - y1], "area": (x2 - x1) * (y2 - y1),
                                "iscrowd": 0})
    categories = [{"id": i + 1, "name": n, "supercategory": "none"} for i, n in enumerate(names)]
    return {"info": {"description": "YOLO-format labels as COCO"}, "images": images, "annotations": annotations,
            "categories": categories}


def cache_json(content: dict, stem: str) -> str:
    """Write ``content`` once under the temp dir, named by its hash (ranks may race; the write is atomic)."""
    return cache_text(json.dumps(content, sort_keys=True), stem, ".json")


# the files cache_text writes and no run has asked for in this many days are removed when it writes another
CACHE_DAYS = 7


def cache_text(text: str, stem: str, suffix: str) -> str:
    """Write ``text`` once under the temp dir as ``stem-<hash><suffix>`` (ranks may race; the write is atomic):
    the files ppdet reads by path (a split's ground truth as COCO json, class names, an ONNX file's config). Each
    use marks the file as used; writing a new one removes those unused for CACHE_DAYS, so the folder stays bounded
    by what recent runs use (a run whose file is removed writes it again)."""
    from ppmulti.common.atomic import atomic_write_text

    digest = hashlib.sha1(text.encode()).hexdigest()[:16]
    path = Path(tempfile.gettempdir()) / "ppmulti-yolo" / f"{stem}-{digest}{suffix}"
    try:
        os.utime(path)
        return str(path)
    except PermissionError:   # another user's, there to read
        return str(path)
    except FileNotFoundError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, text)
    prune_unused(path.parent, CACHE_DAYS * 86400.0)
    return str(path)


def prune_unused(folder: Path, seconds: float) -> list[Path]:
    """Remove the files in ``folder`` not modified for ``seconds``; returns those removed."""
    import time

    removed = []
    cutoff = time.time() - seconds
    for entry in folder.iterdir():
        try:
            if entry.is_file() and entry.stat().st_mtime < cutoff:
                entry.unlink()
                removed.append(entry)
        except OSError:   # removed by another process first, or another user's
            continue
    return removed


def categories_json(spec: DataSpec) -> str:
    """A COCO json with only the categories: what ppdet's inference reads class names from."""
    return cache_json(coco_json([], spec.names), "names")


# ----------------------------------------------------------------------------- the ppdet source
def _dataset_class():
    from ppdet.core.workspace import register, serializable
    from ppdet.data.source.dataset import DetDataset

    @register
    @serializable
    class YOLODataSet(DetDataset):
        """A YOLOv5 dataset yaml's split as a ppdet dataset (``name: YOLODataSet, data: x.yaml, split: val``)."""

        def __init__(self, data: str = "", split: str = "train", data_fields=("image",), sample_num: int = -1,
                     single_cls: bool = False, allow_empty: bool = True, repeat: int = 1, cache=None,
                     rect: bool = False, rect_batch: int = 0, rect_size: int = 0, rect_pad: float = 0.0,
                     **kwargs):
            from ppmulti.rank.data.cache import parse_cache

            self.data, self.split = data, split
            self.cache = parse_cache(cache)   # --cache: None, "ram" or "disk" (see image_store)
            self._stores: dict = {}
            self.rect, self.rect_batch = bool(rect), int(rect_batch)   # --rect: aspect-ratio order, shapes
            self._rect_shapes: dict = {}
            # validation's rect (tools/eval.py --rect): each record carries its batch's letterbox shape
            self.rect_size, self.rect_pad = int(rect_size), float(rect_pad)
            self.single_cls, self.allow_empty = single_cls, allow_empty
            self.spec = load_data_yaml(data)
            super().__init__(dataset_dir=str(self.spec.root), image_dir="", anno_path=None,
                             data_fields=list(data_fields), sample_num=sample_num,
                             repeat=repeat, **kwargs)
            self.roidbs = None

        def check_or_download_dataset(self):
            image_names(self.spec, self.split)  # fails with the path named; nothing is downloaded

        def parse_dataset(self):
            if self.roidbs is not None:   # the evaluator and ppdet's loader both ask; scan the files once
                return
            records, self.report = scan(self.spec, self.split, self.single_cls)
            if not self.allow_empty:
                records = [r for r in records if len(r["gt_bbox"])]
            if self.sample_num > 0:
                records = records[:self.sample_num]
            if self.rect:   # YOLOv5's --rect: sorted by h/w so that a batch holds images of similar shape
                records = sorted(records, key=lambda r: r["h"] / r["w"])
            names = ["object"] if self.single_cls else self.spec.names
            self.catid2clsid = {i + 1: i for i in range(len(names))}
            self.cname2cid = {n: i for i, n in enumerate(names)}
            self.records = records
            # like ppdet's COCO source: ground-truth keys only where data_fields asks (eval batches are images)
            image_keys = ("im_file", "im_id", "h", "w")
            self.roidbs = [{k: v for k, v in r.items() if k in image_keys or k in self.data_fields}
                           for r in records]
            if self.rect and self.rect_size:
                from ppmulti.rank.data.augment import rect_shapes

                batch = max(1, self.rect_batch or 1)
                hw = np.array([[r["h"], r["w"]] for r in self.roidbs], np.float64).reshape(-1, 2)
                shapes = rect_shapes(hw, batch, self.rect_size, 32, self.rect_pad) if len(hw) else []
                for i, r in enumerate(self.roidbs):
                    r["rect_shape"] = np.array(shapes[i // batch], np.int64)

        def image_store(self, size: int, augment: bool = True):
            """This split's images as a store (``images.make_store``) honouring ``cache``, built once per size and
            resize rule. Call it in the rank's main process (e.g. when the pipeline is set up): with a RAM cache
            the loader's workers then inherit the node's one copy instead of building their own."""
            from ppmulti.rank.data.images import make_store

            if self.roidbs is None:
                self.parse_dataset()
            key = (int(size), bool(augment))
            if key not in self._stores:
                files = [r["im_file"] for r in self.roidbs]
                shapes = [(int(r["h"]), int(r["w"])) for r in self.roidbs]
                self._stores[key] = make_store(files, int(size), augment, self.cache, shapes)
            return self._stores[key]

        def __getitem__(self, idx):
            from ppmulti.rank.data.pipeline import uses_source

            if not uses_source(self.transform):
                return super().__getitem__(idx)
            # the pipeline's first op (YOLOv5Mosaic) loads this image and its extra tiles itself, by index,
            # through image_store(); no record copies, no decode by ppdet
            sample = {"_source": self, "_index": idx % len(self.roidbs), "curr_iter": self._curr_iter}
            self._curr_iter += 1
            return self.transform(sample)

        def rect_shape(self, index: int, img_size: int, stride: int = 32):
            """--rect: the (h, w) letterbox shape of the global batch (``rect_batch`` consecutive images in
            aspect-ratio order) that ``index`` belongs to, YOLOv5's rule with pad 0."""
            from ppmulti.rank.data.augment import rect_shapes

            key = (img_size, stride)
            if key not in self._rect_shapes:
                hw = np.array([[r["h"], r["w"]] for r in self.roidbs], np.float64)
                self._rect_shapes[key] = rect_shapes(hw, max(1, self.rect_batch or 1), img_size, stride)
            return tuple(int(v) for v in self._rect_shapes[key][index // max(1, self.rect_batch or 1)])

        def get_anno(self):
            if self.roidbs is None:
                self.parse_dataset()
            names = ["object"] if self.single_cls else self.spec.names
            return cache_json(coco_json(self.records, names), f"{self.split}")

    return YOLODataSet


_REGISTERED = None


def register_source():
    """Register ``YOLODataSet`` with ppdet (workspace and ``ppdet.data.source``), once per process."""
    global _REGISTERED
    if _REGISTERED is None:
        import ppdet.data.source as source

        _REGISTERED = _dataset_class()
        source.YOLODataSet = _REGISTERED  # ppdet's TrainDataset/EvalDataset look sources up by name here
    return _REGISTERED


def use_data_yaml(cfg, path: str | os.PathLike, single_cls: bool = False) -> DataSpec:
    """Point a loaded config's datasets at a YOLOv5 data yaml and set ``num_classes`` from it."""
    spec = load_data_yaml(path)
    for section, split in (("TrainDataset", "train"), ("EvalDataset", "val")):
        if split not in spec.splits:
            continue
        node = cfg[section]
        node.clear()
        node.update({"name": "YOLODataSet", "data": str(spec.yaml_path), "split": split,
                     "single_cls": single_cls})
        if split == "train":
            node["data_fields"] = list(TRAIN_FIELDS)
    test = cfg["TestDataset"]
    test.clear()
    test.update({"name": "ImageFolder", "anno_path": categories_json(spec)})
    cfg["num_classes"] = 1 if single_cls else spec.nc
    return spec
