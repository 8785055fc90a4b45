"""The synthetic demo detection dataset: shapes on noisy backgrounds, in COCO json and YOLOv5 layout."""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ppmulti.errors import UserError
from ppmulti.io import atomic_save, atomic_write_text

CLASS_NAMES: tuple[str, ...] = ("rectangle", "ellipse", "triangle")
FORMATS = ("coco", "yolo", "both")
MARKER = ".ppmulti_demo.json"
BACKGROUND_FRACTION = 0.1   # images with no object at all
MAX_OBJECTS = 4
MAX_PAIR_IOU = 0.4          # overlap allowed ...
MAX_COVER = 0.5             # ... but no shape loses more than half of its box to another


@dataclass(frozen=True)
class DemoDataset:
    root: Path
    train_images: Path
    val_images: Path
    train_json: Path | None
    val_json: Path | None
    data_yaml: Path | None


def _paths(root: Path, fmt: str) -> DemoDataset:
    coco = fmt in ("coco", "both")
    yolo = fmt in ("yolo", "both")
    return DemoDataset(root, root / "images" / "train", root / "images" / "val",
                       root / "annotations" / "instances_train.json" if coco else None,
                       root / "annotations" / "instances_val.json" if coco else None,
                       root / "data.yaml" if yolo else None)


def _check(root: Path, fmt: str, n_train: int, n_val: int, size: int) -> None:
    if fmt not in FORMATS:
        raise UserError(f"--format {fmt!r}: choose one of {', '.join(FORMATS)}")
    if n_train < 1:
        raise UserError(f"--train {n_train}: need at least 1 training image")
    if n_val < 1:
        raise UserError(f"--val {n_val}: need at least 1 validation image")
    if not 64 <= size <= 2048:
        raise UserError(f"--size {size}: image side must be between 64 and 2048 pixels")
    if root.exists() and not root.is_dir():
        raise UserError(f"demo dataset directory {root} exists and is a file; choose another path")


def _overlaps(a: tuple, b: tuple) -> tuple[float, float]:
    """(IoU, the share of the smaller box covered by the other)."""
    ix = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    iy = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = ix * iy
    area_a = (a[2] - a[0]) * (a[3] - a[1])
    area_b = (b[2] - b[0]) * (b[3] - b[1])
    union = area_a + area_b - inter
    return (inter / union if union > 0 else 0.0), inter / max(min(area_a, area_b), 1e-9)


def _too_close(a: tuple, b: tuple) -> bool:
    iou, cover = _overlaps(a, b)
    return iou > MAX_PAIR_IOU or cover > MAX_COVER


def _background(rng: np.random.RandomState, size: int) -> np.ndarray:
    """A smooth two-colour gradient with pixel noise."""
    c0 = rng.randint(40, 216, 3).astype(np.float32)
    c1 = rng.randint(40, 216, 3).astype(np.float32)
    angle = rng.uniform(0, 2 * math.pi)
    ys, xs = np.mgrid[0:size, 0:size].astype(np.float32) / max(size - 1, 1)
    t = np.clip(0.5 + (xs - 0.5) * math.cos(angle) + (ys - 0.5) * math.sin(angle), 0, 1)[..., None]
    img = c0 * (1 - t) + c1 * t
    img += rng.normal(0, rng.uniform(4, 14), img.shape)
    return np.clip(img, 0, 255)


def _colour(rng: np.random.RandomState, background: np.ndarray) -> tuple[int, int, int]:
    """A colour far enough from the local background to be seen."""
    mean = background.reshape(-1, 3).mean(axis=0)
    for _ in range(50):
        c = rng.randint(0, 256, 3)
        if np.linalg.norm(c - mean) > 110:
            return int(c[0]), int(c[1]), int(c[2])
    return tuple(int(255 - v) for v in mean)  # type: ignore[return-value]


def _draw(img: np.ndarray, cls: int, box: tuple[int, int, int, int], colour, rng) -> tuple[float, float, float, float]:
    """Draw one filled shape inside ``box`` (x0, y0, x1, y1 inclusive) and return its tight box."""
    import cv2

    x0, y0, x1, y1 = box
    if cls == 0:
        cv2.rectangle(img, (x0, y0), (x1, y1), colour, thickness=-1)
        return float(x0), float(y0), float(x1 + 1), float(y1 + 1)
    if cls == 1:
        centre = ((x0 + x1) // 2, (y0 + y1) // 2)
        axes = ((x1 - x0) // 2, (y1 - y0) // 2)
        cv2.ellipse(img, centre, axes, 0, 0, 360, colour, thickness=-1)
        return (float(centre[0] - axes[0]), float(centre[1] - axes[1]),
                float(centre[0] + axes[0] + 1), float(centre[1] + axes[1] + 1))
    apex_x = int(rng.randint(x0, x1 + 1))
    pts = np.array([[x0, y1], [x1, y1], [apex_x, y0]], dtype=np.int32)
    cv2.fillPoly(img, [pts], colour)
    return float(x0), float(y0), float(x1 + 1), float(y1 + 1)


def _image(seed: int, split: str, index: int, size: int) -> tuple[np.ndarray, list[tuple[int, tuple]]]:
    """One image and its objects [(class, (x0, y0, x1, y1))], reproducible from (seed, split, index)."""
    split_id = 0 if split == "train" else 1
    rng = np.random.RandomState((seed * 1_000_003 + split_id * 7_919 + index) % (2 ** 32))
    img = _background(rng, size)
    objects: list[tuple[int, tuple]] = []
    n = 0 if rng.rand() < BACKGROUND_FRACTION else rng.randint(1, MAX_OBJECTS + 1)
    min_side = max(16, int(0.08 * size))
    max_side = int(0.45 * size)
    attempts = 0
    while len(objects) < n and attempts < 60:
        attempts += 1
        w = rng.randint(min_side, max_side + 1)
        h = int(np.clip(w * rng.uniform(0.5, 2.0), min_side, max_side))
        x0 = rng.randint(0, size - w)
        y0 = rng.randint(0, size - h)
        cand = (x0, y0, x0 + w - 1, y0 + h - 1)
        if any(_too_close(cand, box) for _, box in objects):
            continue
        cls = int(rng.randint(len(CLASS_NAMES)))
        tight = _draw(img, cls, cand, _colour(rng, img[y0:y0 + h, x0:x0 + w]), rng)
        objects.append((cls, tuple(min(max(v, 0.0), float(size)) for v in tight)))
    return img.astype(np.uint8), objects


def _write_jpeg(path: Path, img: np.ndarray) -> None:
    import cv2

    ok, buf = cv2.imencode(".jpg", img, [cv2.IMWRITE_JPEG_QUALITY, 92])
    if not ok:
        raise RuntimeError(f"JPEG encoding failed for {path}")
    atomic_save(path, lambda tmp: Path(tmp).write_bytes(buf.tobytes()))


def _coco(split_objects: list[tuple[str, list]], size: int) -> dict:
    images, annotations = [], []
    for image_id, (name, objects) in enumerate(split_objects, start=1):
        images.append({"id": image_id, "file_name": name, "width": size, "height": size})
        for cls, (x0, y0, x1, y1) in objects:
            w, h = round(x1 - x0, 2), round(y1 - y0, 2)
            annotations.append({"id": len(annotations) + 1, "image_id": image_id, "category_id": cls + 1,
                                "bbox": [round(x0, 2), round(y0, 2), w, h], "area": round(w * h, 2),
                                "iscrowd": 0})
    return {"info": {"description": "ppmulti synthetic demo set", "version": "1"}, "licenses": [],
            "images": images, "annotations": annotations,
            "categories": [{"id": i + 1, "name": n, "supercategory": "shape"} for i, n in enumerate(CLASS_NAMES)]}


def _yolo_label(objects: list, size: int) -> str:
    lines = []
    for cls, (x0, y0, x1, y1) in objects:
        lines.append(f"{cls} {(x0 + x1) / 2 / size:.6f} {(y0 + y1) / 2 / size:.6f} "
                     f"{(x1 - x0) / size:.6f} {(y1 - y0) / size:.6f}")
    return "".join(line + "\n" for line in lines)


def _args(fmt: str, n_train: int, n_val: int, size: int, seed: int) -> dict:
    return {"format": fmt, "train": n_train, "val": n_val, "size": size, "seed": seed, "version": 1}


def exists(root: str | os.PathLike, fmt: str = "both") -> bool:
    """True when a complete demo set holding ``fmt`` is at ``root`` (the marker is written last)."""
    marker = Path(root) / MARKER
    if not marker.is_file():
        return False
    try:
        have = json.loads(marker.read_text())["format"]
    except (ValueError, KeyError):
        return False
    return have == "both" or have == fmt


def generate(root: str | os.PathLike, fmt: str = "both", n_train: int = 256, n_val: int = 64, size: int = 256,
             seed: int = 0) -> DemoDataset:
    """Write the demo set; the same arguments give the same bytes."""
    import yaml

    root = Path(root)
    _check(root, fmt, n_train, n_val, size)
    paths = _paths(root, fmt)
    (root / MARKER).unlink(missing_ok=True)
    for split, count in (("train", n_train), ("val", n_val)):
        image_dir = root / "images" / split
        image_dir.mkdir(parents=True, exist_ok=True)
        records = []
        for index in range(count):
            img, objects = _image(seed, split, index, size)
            name = f"{index:06d}.jpg"
            _write_jpeg(image_dir / name, img)
            records.append((name, objects))
            if fmt in ("yolo", "both"):
                atomic_write_text(root / "labels" / split / f"{index:06d}.txt", _yolo_label(objects, size))
        if fmt in ("coco", "both"):
            atomic_write_text(root / "annotations" / f"instances_{split}.json",
                              json.dumps(_coco(records, size), sort_keys=True, indent=1) + "\n")
    if fmt in ("yolo", "both"):
        data = {"path": str(root.resolve()), "train": "images/train", "val": "images/val",
                "nc": len(CLASS_NAMES), "names": list(CLASS_NAMES)}
        atomic_write_text(root / "data.yaml", yaml.safe_dump(data, sort_keys=False))
    atomic_write_text(root / MARKER, json.dumps(_args(fmt, n_train, n_val, size, seed), sort_keys=True) + "\n")
    return paths
