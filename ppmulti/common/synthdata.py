"""The synthetic demo detection dataset: shapes on noisy backgrounds, in COCO json, YOLOv5 or Pascal VOC layout."""

from __future__ import annotations

import json
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ppmulti.common.errors import UserError
from ppmulti.common.atomic import atomic_write_text

CLASS_NAMES: tuple[str, ...] = ("rectangle", "ellipse", "triangle")
FORMATS = ("coco", "yolo", "both", "voc")   # both: COCO and YOLO
MARKER = ".ppmulti_demo.json"
GENERATOR_VERSION = 3       # bump when the same arguments start giving different bytes
BACKGROUND_FRACTION = 0.1   # images with no object at all
MAX_OBJECTS = 3
MAX_PAIR_IOU = 0.4          # overlap allowed ...
MAX_COVER = 0.5             # ... but no shape loses more than half of its box to another ...
MAX_HIDDEN = 0.3            # ... nor more than 30% of its pixels to the shapes drawn over it
MIN_SIDE_FRACTION = 0.12    # object sides span 12%-40% of the image side ...
MAX_SIDE_FRACTION = 0.40
MIN_SIDE_PX = 16            # ... and never fall under 16 px, which small detectors miss
MIN_COLOUR_DISTANCE = 80    # RGB distance from the local background, so every shape stands out
_NUMBERED = re.compile(r"^(\d{6,})\.(jpg|txt)$")


@dataclass(frozen=True)
class DemoDataset:
    """Where the parts of a generated demo set live; the paths of formats not written are None."""

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


def _is_int(value: object) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def _check_fmt(fmt: object) -> None:
    if fmt not in FORMATS:
        raise UserError(f"format (--format) {fmt!r} is unknown: choose one of {', '.join(FORMATS)}")


def _check(root: Path, fmt: str, n_train: int, n_val: int, size: int, seed: int) -> None:
    _check_fmt(fmt)
    for name, flag, value in (("n_train", "--train", n_train), ("n_val", "--val", n_val),
                              ("size", "--size", size), ("seed", "--seed", seed)):
        if not _is_int(value):
            raise UserError(f"{name} ({flag}) {value!r} is not an integer: pass a whole number")
    if n_train < 1:
        raise UserError(f"n_train (--train) {n_train} is too small: need at least 1 training image")
    if n_val < 1:
        raise UserError(f"n_val (--val) {n_val} is too small: need at least 1 validation image")
    if not 64 <= size <= 2048:
        raise UserError(f"size (--size) {size} is out of range: the image side must be 64 to 2048 pixels")
    for parent in (root, *root.parents):
        if parent.exists():
            if not parent.is_dir():
                raise UserError(f"demo dataset directory {root}: {parent} exists and is a file; "
                                f"choose another path")
            break


def _rng(seed: int, split: str, index: int) -> np.random.RandomState:
    """The generator for one image.

    SeedSequence mixes (seed, split, index) without the collisions of arithmetic seeds (seed 0's
    val image 0 must not equal its train image 7919). RandomState over MT19937 is used because numpy
    freezes its streams: every node of a multi-node run that generates its own copy gets the same bytes.
    """
    entropy = [abs(int(seed)), int(seed < 0), 0 if split == "train" else 1, index]
    return np.random.RandomState(np.random.MT19937(np.random.SeedSequence(entropy)))


def _overlaps(a: tuple, b: tuple) -> tuple[float, float]:
    """(IoU, the share of the smaller box covered by the other), for inclusive pixel boxes."""
    ix = max(0, min(a[2], b[2]) - max(a[0], b[0]) + 1)
    iy = max(0, min(a[3], b[3]) - max(a[1], b[1]) + 1)
    inter = ix * iy
    area_a = (a[2] - a[0] + 1) * (a[3] - a[1] + 1)
    area_b = (b[2] - b[0] + 1) * (b[3] - b[1] + 1)
    return inter / (area_a + area_b - inter), inter / min(area_a, area_b)


def _too_close(a: tuple, b: tuple) -> bool:
    iou, cover = _overlaps(a, b)
    return iou > MAX_PAIR_IOU or cover > MAX_COVER


def _background(rng: np.random.RandomState, size: int) -> np.ndarray:
    """A grey level with a faint left-right gradient, under strong per-pixel noise (uniform, +-30).

    Grey, because colourful backgrounds compete with the shapes: on saturated or tinted gradients
    PP-YOLOE tiny was at mAP50 0.02-0.05 after 6 epochs, against 0.19-0.37 on noisy grey.
    """
    base = float(rng.randint(90, 171))
    tilt = rng.uniform(-20, 20)
    axis = np.linspace(-0.5, 0.5, size, dtype=np.float32)
    noise = rng.randint(-30, 31, (size, size, 3)).astype(np.float32)
    img = base + tilt * axis[None, :, None] + noise
    return np.clip(img, 0, 255).astype(np.uint8)


def _colour(rng: np.random.RandomState, patch: np.ndarray,
            neighbours: list[tuple[int, int, int]]) -> tuple[int, int, int]:
    """A colour far enough from the mean of the region it is drawn on, and from the shapes it
    overlaps, for its outline to be seen where the two meet."""
    mean = patch.reshape(-1, 3).mean(axis=0)
    avoid = [mean, *(np.array(n, dtype=np.float64) for n in neighbours)]
    for _ in range(50):
        c = rng.randint(0, 256, 3)
        if all(np.linalg.norm(c - a) > MIN_COLOUR_DISTANCE for a in avoid):
            return int(c[0]), int(c[1]), int(c[2])
    # The farthest corner of the RGB cube is always at least 221 away from any colour.
    return tuple(0 if v > 127 else 255 for v in mean)  # type: ignore[return-value]


def _draw(img: np.ndarray, cls: int, box: tuple[int, int, int, int], colour: tuple[int, int, int],
          rng: np.random.RandomState) -> tuple[float, float, float, float]:
    """Draw one filled shape inside ``box`` (x0, y0, x1, y1 inclusive) and return its tight box.

    The box comes from the shape's geometry, as [x_min, y_min, x_max + 1, y_max + 1) in pixels: the
    filled shapes are not antialiased, so their extreme pixels are exactly the extreme vertices.
    """
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
    # An upright triangle with its apex near the middle of the base, so it never looks like half a
    # rectangle (triangles in all orientations with the apex anywhere were much slower to learn).
    a = int(rng.randint(x0 + 3 * (x1 - x0) // 8, x1 - 3 * (x1 - x0) // 8 + 1))
    pts = [[x0, y1], [x1, y1], [a, y0]]
    cv2.fillPoly(img, [np.array(pts, dtype=np.int32)], colour)
    return float(x0), float(y0), float(x1 + 1), float(y1 + 1)


def _image(seed: int, split: str, index: int, size: int) -> tuple[np.ndarray, list[tuple[int, tuple]]]:
    """One image and its objects [(class, (x0, y0, x1, y1))], reproducible from (seed, split, index)."""
    rng = _rng(seed, split, index)
    img = _background(rng, size)
    objects: list[tuple[int, tuple]] = []
    n = 0 if rng.rand() < BACKGROUND_FRACTION else rng.randint(1, MAX_OBJECTS + 1)
    min_side = max(MIN_SIDE_PX, int(MIN_SIDE_FRACTION * size))
    max_side = int(MAX_SIDE_FRACTION * size)
    drawn: list[tuple[tuple[int, int, int, int], tuple[int, int, int]]] = []  # (box, colour)
    owner = np.full((size, size), -1, np.int8)  # which shape each pixel shows, -1 for background
    areas: list[int] = []                       # each shape's full pixel count
    attempts = 0
    while len(objects) < n and attempts < 60:
        attempts += 1
        w = rng.randint(min_side, max_side + 1)
        h = rng.randint(min_side, max_side + 1)   # width and height independent: aspect 1:3 to 3:1
        x0 = rng.randint(0, size - w + 1)
        y0 = rng.randint(0, size - h + 1)
        cand = (x0, y0, x0 + w - 1, y0 + h - 1)
        if any(_too_close(cand, box) for box, _ in drawn):
            continue
        cls = int(rng.randint(len(CLASS_NAMES)))
        # Boxes alone do not bound occlusion: a rectangle over half a triangle's box can hide most of
        # the triangle. So render the shape as a mask first and check what it would hide.
        mask = np.zeros((size, size), np.uint8)
        tight = _draw(mask, cls, cand, (255, 255, 255), rng)
        covered = mask.astype(bool)
        if any(np.count_nonzero((owner == j) & ~covered) < (1 - MAX_HIDDEN) * area
               for j, area in enumerate(areas)):
            continue
        touching = [c for box, c in drawn if _overlaps(cand, box)[0] > 0]
        colour = _colour(rng, img[y0:y0 + h, x0:x0 + w], touching)
        img[covered] = colour
        owner[covered] = len(drawn)
        areas.append(int(np.count_nonzero(covered)))
        drawn.append((cand, colour))
        # Clipping is a no-op today (candidates lie inside the image); it keeps the boxes valid if
        # shapes are ever allowed to leave the frame.
        objects.append((cls, tuple(min(max(v, 0.0), float(size)) for v in tight)))
    return img, objects


def _write_bytes(path: Path, data: bytes) -> None:
    """Atomic (temp file beside it, then rename) but not fsynced: images are cheap to regenerate,
    and fsyncing hundreds of small files doubled the run time. The marker, written last with fsync,
    is what says the set is complete."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o644)  # mkstemp makes 0600 files; datasets are often read by other users
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _jpeg(img: np.ndarray) -> bytes:
    import cv2

    ok, buf = cv2.imencode(".jpg", img, [cv2.IMWRITE_JPEG_QUALITY, 92])
    if not ok:
        raise RuntimeError("JPEG encoding failed")
    return buf.tobytes()


def _coco(split_objects: list[tuple[str, list]], size: int) -> dict:
    images, annotations = [], []
    for image_id, (name, objects) in enumerate(split_objects, start=1):
        images.append({"id": image_id, "file_name": name, "width": size, "height": size})
        for cls, (x0, y0, x1, y1) in objects:
            w, h = round(x1 - x0, 2), round(y1 - y0, 2)
            annotations.append({"id": len(annotations) + 1, "image_id": image_id, "category_id": cls + 1,
                                "bbox": [round(x0, 2), round(y0, 2), w, h], "area": round(w * h, 2),
                                "iscrowd": 0})
    # pycocotools 2.0.10's loadRes (used by ppdet's COCO eval) reads dataset["info"]: keep it.
    return {"info": {"description": "ppmulti synthetic demo set", "version": str(GENERATOR_VERSION)},
            "licenses": [], "images": images, "annotations": annotations,
            "categories": [{"id": i + 1, "name": n, "supercategory": "shape"} for i, n in enumerate(CLASS_NAMES)]}


def _yolo_label(objects: list, size: int) -> str:
    lines = []
    for cls, (x0, y0, x1, y1) in objects:
        lines.append(f"{cls} {(x0 + x1) / 2 / size:.6f} {(y0 + y1) / 2 / size:.6f} "
                     f"{(x1 - x0) / size:.6f} {(y1 - y0) / size:.6f}")
    return "".join(line + "\n" for line in lines)


def _args(fmt: str, n_train: int, n_val: int, size: int, seed: int) -> dict:
    return {"format": fmt, "train": int(n_train), "val": int(n_val), "size": int(size), "seed": int(seed),
            "version": GENERATOR_VERSION}


def _read_marker(root: Path) -> dict | None:
    try:
        data = json.loads((root / MARKER).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _remove_stale(directory: Path, keep: int) -> None:
    """Delete numbered files (ours, by name) from index ``keep`` on, left by an earlier, larger run;
    a YOLO loader lists the directory and would otherwise train on them."""
    if not directory.is_dir():
        return
    for entry in directory.iterdir():
        m = _NUMBERED.match(entry.name)
        if m and int(m.group(1)) >= keep and entry.is_file():
            entry.unlink()


def exists(root: str | os.PathLike, fmt: str = "both") -> bool:
    """True when a complete demo set holding ``fmt`` is at ``root``.

    Cheap: reads the marker (written last by ``generate``) and checks the format's index files are there.
    """
    _check_fmt(fmt)
    root = Path(root)
    marker = _read_marker(root)
    if marker is None or marker.get("format") not in FORMATS:
        return False
    if marker["format"] != "both" and marker["format"] != fmt:
        return False
    paths = _paths(root, fmt)
    needed = [paths.train_images, paths.val_images, paths.train_json, paths.val_json, paths.data_yaml,
              root / "label_list.txt" if fmt == "voc" else None]
    return all(p.exists() for p in needed if p is not None)


def generate(root: str | os.PathLike, fmt: str = "both", n_train: int = 256, n_val: int = 64, size: int = 256,
             seed: int = 0) -> DemoDataset:
    """Write the demo set at ``root`` (created if missing); the same arguments give the same bytes.

    Regenerating over an earlier demo set replaces it: surplus numbered images and labels, and the
    files of a format no longer asked for, are removed.
    """
    import yaml

    root = Path(root)
    _check(root, fmt, n_train, n_val, size, seed)
    paths = _paths(root, fmt)
    previous = _read_marker(root)
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"demo dataset directory {root} cannot be created ({exc.strerror}); "
                        f"choose another path") from exc
    # Unpublish first: from here until the marker is rewritten the set is incomplete.
    (root / MARKER).unlink(missing_ok=True)
    coco = fmt in ("coco", "both")
    yolo = fmt in ("yolo", "both")
    voc = fmt == "voc"
    for split, count in (("train", n_train), ("val", n_val)):
        image_dir = root / "images" / split
        label_dir = root / "labels" / split
        image_dir.mkdir(parents=True, exist_ok=True)
        if yolo:
            label_dir.mkdir(parents=True, exist_ok=True)
        records = []
        for index in range(count):
            img, objects = _image(seed, split, index, size)
            name = f"{index:06d}.jpg"
            _write_bytes(image_dir / name, _jpeg(img))
            records.append((name, objects))
            if yolo:
                _write_bytes(label_dir / f"{index:06d}.txt", _yolo_label(objects, size).encode())
        _remove_stale(image_dir, count)
        _remove_stale(label_dir, count if yolo else 0)
        json_path = root / "annotations" / f"instances_{split}.json"
        if coco:
            atomic_write_text(json_path, json.dumps(_coco(records, size), sort_keys=True, indent=1) + "\n")
        elif previous is not None:
            json_path.unlink(missing_ok=True)
        if voc:
            from ppmulti.common import layouts

            samples = [layouts.Sample(image_dir / name, size, size, [(c, *box) for c, box in objects])
                       for name, objects in records]
            layouts.write_voc(layouts.Dataset(list(CLASS_NAMES), {split: samples}), root)
    if yolo:
        data = {"path": str(root.resolve()), "train": "images/train", "val": "images/val",
                "nc": len(CLASS_NAMES), "names": list(CLASS_NAMES)}
        atomic_write_text(root / "data.yaml", yaml.safe_dump(data, sort_keys=False))
    elif previous is not None:
        (root / "data.yaml").unlink(missing_ok=True)  # ours: the old marker says this was a demo set
    if voc:   # write_voc wrote it with each split; one list of both splits' classes
        atomic_write_text(root / "label_list.txt", "".join(f"{n}\n" for n in CLASS_NAMES))
    atomic_write_text(root / MARKER, json.dumps(_args(fmt, n_train, n_val, size, seed), sort_keys=True) + "\n")
    return paths
