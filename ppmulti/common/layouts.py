"""Detection dataset layouts (YOLO txt + data.yaml, COCO json, Pascal VOC xml): read one, write another."""

from __future__ import annotations

import json
import os
import shutil
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

from ppmulti.common.atomic import atomic_write_text
from ppmulti.common.errors import UserError, first_line
from ppmulti.common.paths import IMAGE_SUFFIXES

LAYOUTS = ("yolo", "coco", "voc")


@dataclass
class Sample:
    """One image: its file, its size in pixels, and its boxes as (class index, x0, y0, x1, y1) in pixels."""

    image: Path
    width: int
    height: int
    boxes: list[tuple[int, float, float, float, float]] = field(default_factory=list)


@dataclass
class Dataset:
    """Class names (index = class id) and the samples of each split, in the order the source lists them."""

    names: list[str]
    splits: dict[str, list[Sample]]


def detect(src: Path) -> str:
    """Which layout ``src`` holds: a data.yaml (YOLO), label_list.txt (VOC), or annotations/*.json (COCO)."""
    if src.is_file() and src.suffix in (".yaml", ".yml"):
        return "yolo"
    if (src / "data.yaml").is_file():
        return "yolo"
    if (src / "label_list.txt").is_file():
        return "voc"
    if list((src / "annotations").glob("*.json")):
        return "coco"
    raise UserError(f"{src}: no data.yaml (YOLO), label_list.txt (VOC) or annotations/*.json (COCO) found; "
                    f"pass the dataset's directory")


def read(src: str | os.PathLike) -> Dataset:
    """The dataset at ``src`` in whichever layout it holds."""
    path = Path(src)
    kind = detect(path)
    return {"yolo": read_yolo, "coco": read_coco, "voc": read_voc}[kind](path)


def _image_size(path: Path) -> tuple[int, int]:
    import cv2

    img = cv2.imread(str(path), cv2.IMREAD_UNCHANGED)
    if img is None:
        raise UserError(f"{path}: not a readable image")
    return int(img.shape[1]), int(img.shape[0])


def _yaml(path: Path) -> dict:
    import yaml

    try:
        raw = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise UserError(f"{path}: cannot be read as YAML ({first_line(exc)})") from None
    if not isinstance(raw, dict):
        raise UserError(f"{path}: expected a mapping with train, val and names")
    return raw


def read_yolo(src: Path) -> Dataset:
    """A YOLOv5 data yaml (``path``, ``train``/``val`` image directories, ``names``) and its label files."""
    yaml_path = src if src.is_file() else src / "data.yaml"
    raw = _yaml(yaml_path)
    names = raw.get("names")
    if isinstance(names, dict):
        names = [names[k] for k in sorted(names)]
    if not isinstance(names, list) or not names:
        raise UserError(f"{yaml_path}: names must list the classes")
    root = Path(raw.get("path") or yaml_path.parent)
    root = root if root.is_absolute() else (yaml_path.parent / root)
    splits: dict[str, list[Sample]] = {}
    for split in ("train", "val", "test"):
        entry = raw.get(split)
        if not entry:
            continue
        folder = root / str(entry)
        if not folder.is_dir():
            raise UserError(f"{yaml_path}: {split}: {folder} is not a directory of images")
        samples = []
        for image in sorted(p for p in folder.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES):
            w, h = _image_size(image)
            parts = list(image.parts)
            where = len(parts) - 1 - parts[::-1].index("images") if "images" in parts else None
            if where is None:
                raise UserError(f"{image}: a YOLO image lives under an images/ directory (labels/ beside it)")
            parts[where] = "labels"
            label = Path(*parts).with_suffix(".txt")
            boxes = []
            if label.is_file():
                for lineno, line in enumerate(label.read_text().splitlines(), 1):
                    fields = line.split()
                    if not fields:
                        continue
                    if len(fields) != 5:
                        raise UserError(f"{label}:{lineno}: expected 'class x_center y_center width height'")
                    c, cx, cy, bw, bh = int(float(fields[0])), *(float(v) for v in fields[1:])
                    boxes.append((c, (cx - bw / 2) * w, (cy - bh / 2) * h, (cx + bw / 2) * w, (cy + bh / 2) * h))
            samples.append(Sample(image.resolve(), w, h, boxes))
        splits[split] = samples
    return Dataset([str(n) for n in names], splits)


def read_coco(src: Path) -> Dataset:
    """``annotations/instances_<split>.json`` with images in ``images/<split>`` or ``<split>`` (COCO's own
    ``train2017``); categories in id order become class indices 0, 1, ..."""
    splits: dict[str, list[Sample]] = {}
    names: list[str] | None = None
    for anno in sorted((src / "annotations").glob("instances_*.json")):
        split = anno.stem[len("instances_"):]
        folder = next((d for d in (src / "images" / split, src / split) if d.is_dir()), None)
        if folder is None:
            raise UserError(f"{anno}: no image directory {src / 'images' / split} or {src / split}")
        try:
            data = json.loads(anno.read_text())
        except (OSError, ValueError) as exc:
            raise UserError(f"{anno}: not COCO json ({first_line(exc)})") from None
        cats = sorted(data.get("categories", []), key=lambda c: c["id"])
        these = [str(c["name"]) for c in cats]
        if names is not None and these != names:
            raise UserError(f"{anno}: its categories differ from the other split's")
        names = these
        index = {c["id"]: i for i, c in enumerate(cats)}
        by_image: dict[int, list] = {}
        for a in data.get("annotations", []):
            if a.get("iscrowd", 0):
                continue
            x, y, bw, bh = a["bbox"]
            by_image.setdefault(a["image_id"], []).append((index[a["category_id"]], x, y, x + bw, y + bh))
        splits[split] = [Sample((folder / im["file_name"]).resolve(), int(im["width"]), int(im["height"]),
                                by_image.get(im["id"], [])) for im in data.get("images", [])]
    if names is None:
        raise UserError(f"{src}: no annotations/instances_<split>.json found")
    return Dataset(names, splits)


def read_voc(src: Path) -> Dataset:
    """PaddleDetection's VOC layout: ``label_list.txt`` (one class a line) and ``<split>.txt`` lists of
    'image xml' lines, paths relative to ``src``."""
    names = [line.strip() for line in (src / "label_list.txt").read_text().splitlines() if line.strip()]
    splits: dict[str, list[Sample]] = {}
    for listing in sorted(src.glob("*.txt")):
        if listing.name == "label_list.txt":
            continue
        samples = []
        for lineno, line in enumerate(listing.read_text().splitlines(), 1):
            if not line.strip():
                continue
            fields = line.split()
            if len(fields) != 2:
                raise UserError(f"{listing}:{lineno}: expected 'image_path xml_path'")
            image, xml = src / fields[0], src / fields[1]
            try:
                root = ET.parse(xml).getroot()
            except (OSError, ET.ParseError) as exc:
                raise UserError(f"{xml}: not VOC xml ({first_line(exc)})") from None
            size = root.find("size")
            w, h = (int(float(size.findtext(k))) for k in ("width", "height")) if size is not None else \
                _image_size(image)
            boxes = []
            for obj in root.iter("object"):
                name = obj.findtext("name", "").strip()
                if name not in names:
                    raise UserError(f"{xml}: class {name!r} is not in {src / 'label_list.txt'}")
                bb = obj.find("bndbox")
                x0, y0, x1, y1 = (float(bb.findtext(k)) for k in ("xmin", "ymin", "xmax", "ymax"))
                boxes.append((names.index(name), x0, y0, x1, y1))
            samples.append(Sample(image.resolve(), w, h, boxes))
        splits[listing.stem] = samples
    return Dataset(names, splits)


def _place(sample: Sample, dst_dir: Path) -> str:
    """The image's file name under ``dst_dir``: linked there (a hard link costs no space: COCO's 118,287 training
    images stay one copy), else copied, unless it already is there."""
    target = dst_dir / sample.image.name
    if target.resolve() != sample.image.resolve():
        dst_dir.mkdir(parents=True, exist_ok=True)
        target.unlink(missing_ok=True)
        try:
            os.link(sample.image, target)
        except OSError:   # another file system, or one without hard links
            shutil.copy2(sample.image, target)
    return sample.image.name


def write_yolo(ds: Dataset, dst: Path) -> Path:
    """``images/<split>``, ``labels/<split>`` (class cx cy w h, normalised) and ``data.yaml``."""
    import yaml

    for split, samples in ds.splits.items():
        for s in samples:
            name = _place(s, dst / "images" / split)
            lines = [f"{c} {(x0 + x1) / 2 / s.width:.6f} {(y0 + y1) / 2 / s.height:.6f} "
                     f"{(x1 - x0) / s.width:.6f} {(y1 - y0) / s.height:.6f}\n" for c, x0, y0, x1, y1 in s.boxes]
            atomic_write_text(dst / "labels" / split / (Path(name).stem + ".txt"), "".join(lines))
    data = {"path": str(dst.resolve()), **{split: f"images/{split}" for split in ds.splits},
            "nc": len(ds.names), "names": ds.names}
    atomic_write_text(dst / "data.yaml", yaml.safe_dump(data, sort_keys=False))
    return dst / "data.yaml"


def coco_dict(ds: Dataset, samples: list[Sample]) -> dict:
    """One split as COCO json (category id = class index + 1; ``info`` kept for pycocotools' loadRes)."""
    images, annotations = [], []
    for image_id, s in enumerate(samples, start=1):
        images.append({"id": image_id, "file_name": s.image.name, "width": s.width, "height": s.height})
        for c, x0, y0, x1, y1 in s.boxes:
            w, h = round(x1 - x0, 2), round(y1 - y0, 2)
            annotations.append({"id": len(annotations) + 1, "image_id": image_id, "category_id": c + 1,
                                "bbox": [round(x0, 2), round(y0, 2), w, h], "area": round(w * h, 2), "iscrowd": 0})
    return {"info": {"description": "written by ppmulti data convert"}, "licenses": [], "images": images,
            "annotations": annotations,
            "categories": [{"id": i + 1, "name": n, "supercategory": "none"} for i, n in enumerate(ds.names)]}


def write_coco(ds: Dataset, dst: Path) -> Path:
    """``images/<split>`` and ``annotations/instances_<split>.json``."""
    for split, samples in ds.splits.items():
        for s in samples:
            _place(s, dst / "images" / split)
        atomic_write_text(dst / "annotations" / f"instances_{split}.json",
                          json.dumps(coco_dict(ds, samples), indent=1) + "\n")
    return dst / "annotations"


def voc_xml(sample: Sample, names: list[str]) -> str:
    """One image's Pascal VOC annotation."""
    root = ET.Element("annotation")
    ET.SubElement(root, "filename").text = sample.image.name
    size = ET.SubElement(root, "size")
    for key, value in (("width", sample.width), ("height", sample.height), ("depth", 3)):
        ET.SubElement(size, key).text = str(value)
    for c, x0, y0, x1, y1 in sample.boxes:
        obj = ET.SubElement(root, "object")
        ET.SubElement(obj, "name").text = names[c]
        ET.SubElement(obj, "difficult").text = "0"
        box = ET.SubElement(obj, "bndbox")
        for key, value in (("xmin", x0), ("ymin", y0), ("xmax", x1), ("ymax", y1)):
            ET.SubElement(box, key).text = f"{value:g}"
    ET.indent(root)
    return ET.tostring(root, encoding="unicode") + "\n"


def write_voc(ds: Dataset, dst: Path) -> Path:
    """``images/<split>``, ``Annotations/<split>/*.xml``, ``<split>.txt`` ('image xml' lines), ``label_list.txt``."""
    for split, samples in ds.splits.items():
        lines = []
        for s in samples:
            name = _place(s, dst / "images" / split)
            xml = f"Annotations/{split}/{Path(name).stem}.xml"
            atomic_write_text(dst / xml, voc_xml(s, ds.names))
            lines.append(f"images/{split}/{name} {xml}\n")
        atomic_write_text(dst / f"{split}.txt", "".join(lines))
    atomic_write_text(dst / "label_list.txt", "".join(f"{n}\n" for n in ds.names))
    return dst / "label_list.txt"


def convert(src: str | os.PathLike, dst: str | os.PathLike, to: str) -> tuple[Dataset, Path]:
    """Read the dataset at ``src`` (its layout detected) and write it at ``dst`` in layout ``to``."""
    if to not in LAYOUTS:
        raise UserError(f"--to {to!r} is unknown: choose one of {', '.join(LAYOUTS)}")
    source = Path(src)
    if not source.exists():
        raise UserError(f"{source}: no such dataset directory")
    ds = read(source)
    out = Path(dst)
    written = {"yolo": write_yolo, "coco": write_coco, "voc": write_voc}[to](ds, out)
    return ds, written
