"""COCO-json datasets checked and cached at the scan: ppdet's COCODataSet, its json and images checked (a broken
json, unusable images, boxes of no size or outside the image, sizes that disagree), parsed once per node and json;
the ground truth an evaluation scores against, cleaned as the scan cleaned the records."""

from __future__ import annotations

import hashlib
import json
import logging
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ppmulti.common.errors import UserError
from ppmulti.rank.data import cache

log = logging.getLogger("ppmulti")

NAME = "CachedCOCODataSet"
CACHED_FIELDS = {"image", "gt_bbox", "gt_class", "is_crowd"}   # what a detector trains on: plain arrays
SUFFIX = ".ppmulti.cache"
CHECKS = "checked-1"   # in the cache key: a cache written before the scan's checks (or by older ones) is rebuilt
SHOWN = 3              # names shown in a line that counts files
EPS = 1e-5             # ppdet's own threshold for a box of no width or height


# ----------------------------------------------------------------------------- the scan's checks
def load_json(path: str | os.PathLike) -> dict:
    """A COCO json, or one line naming the file and where it breaks (a file cut short, a stray character)."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except json.JSONDecodeError as exc:
        raise UserError(f"{path}: not valid JSON at line {exc.lineno} column {exc.colno} ({exc.msg}): the file is "
                        f"cut short or damaged; restore or regenerate it") from None
    except UnicodeDecodeError as exc:
        raise UserError(f"{path}: not a text file (byte {exc.start} is not UTF-8); a COCO annotation file is "
                        f"JSON") from None
    except OSError as exc:
        raise UserError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    if not isinstance(data, dict) or not isinstance(data.get("images", []), list):
        raise UserError(f"{path}: a COCO json is a mapping with images, annotations and categories")
    return data


@dataclass
class ScanNotes:
    """What the scan of a COCO or VOC set found: unusable images skipped, boxes dropped or clipped, images whose
    annotated size is not their size as read. Kept in the scan cache, so every start says the same."""

    skipped: list[tuple[str, str]] = field(default_factory=list)            # (file, why)
    resized: list[tuple[str, int, int, int, int]] = field(default_factory=list)   # (file, annotated w, h, w, h)
    dropped: int = 0
    clipped: int = 0

    def lines(self, where: str) -> list[str]:
        out = []
        if self.skipped:
            shown = ", ".join(f"{p} ({why})" for p, why in self.skipped[:SHOWN])
            out.append(f"{where}: skipped {len(self.skipped)} image(s) that cannot be used: {shown}"
                       f"{' ...' if len(self.skipped) > SHOWN else ''}")
        if self.dropped or self.clipped:
            out.append(f"{where}: {self.dropped} box(es) of zero or negative width or height dropped, "
                       f"{self.clipped} box(es) reaching outside their image clipped to it")
        if self.resized:
            shown = ", ".join(f"{p} (annotated {aw}x{ah}, read {w}x{h})" for p, aw, ah, w, h in self.resized[:SHOWN])
            out.append(f"{where}: {len(self.resized)} image(s) whose width/height in the annotations differ from "
                       f"the image as read (EXIF orientation applied): {shown}"
                       f"{' ...' if len(self.resized) > SHOWN else ''}; their boxes are clipped to the image as read: "
                       f"check that the annotations were made on the image as displayed")
        return out

    def to_arrays(self) -> dict[str, np.ndarray]:
        return {"skipped": np.array([list(x) for x in self.skipped], dtype=str).reshape(-1, 2),
                "resized_files": np.array([x[0] for x in self.resized], dtype=str),
                "resized_sizes": np.array([x[1:] for x in self.resized], np.int64).reshape(-1, 4),
                "box_notes": np.array([self.dropped, self.clipped], np.int64)}

    @classmethod
    def from_arrays(cls, a: dict[str, np.ndarray]) -> "ScanNotes":
        return cls([(str(p), str(w)) for p, w in a["skipped"]],
                   [(str(p), *(int(v) for v in s)) for p, s in zip(a["resized_files"], a["resized_sizes"])],
                   int(a["box_notes"][0]), int(a["box_notes"][1]))


NOTE_FIELDS = ("skipped", "resized_files", "resized_sizes", "box_notes")


def _no_size(inst: dict) -> bool:
    """An annotation ppdet's parse leaves out for its box (an all-zero box, no area, no width or height)."""
    box = inst.get("bbox")
    if inst.get("ignore", False) or not isinstance(box, (list, tuple)) or len(box) != 4:
        return False
    try:
        x, y, w, h = (float(v) for v in box)
        area = float(inst.get("area", w * h))
    except (TypeError, ValueError):
        return True
    return not (area > 0 and w > EPS and h > EPS)


def json_notes(data: dict, image_dir: str, load_crowd: bool, boxes: bool = True) -> ScanNotes:
    """What ppdet's parse drops without a word (its warnings reach no log): images missing from disk and (with
    ``boxes``: a set that trains on its records' boxes) boxes of no size, counted from the json itself."""
    notes = ScanNotes()
    listed = {}
    for im in data.get("images") or []:
        if isinstance(im, dict) and "file_name" in im:
            path = os.path.join(image_dir, im["file_name"]) if image_dir else im["file_name"]
            listed[im.get("id")] = path
            if not os.path.exists(path):
                notes.skipped.append((path, "missing"))
    for inst in (data.get("annotations") or []) if boxes else []:
        if not isinstance(inst, dict) or inst.get("image_id") not in listed:
            continue
        if inst.get("iscrowd") and not load_crowd:
            continue
        notes.dropped += _no_size(inst)
    return notes


def check_records(records: list[dict], notes: ScanNotes, threads: int | None = None) -> list[dict]:
    """Every record's image opened (header and EXIF orientation, as OpenCV then decodes it): unusable ones
    skipped, the size as read replacing the annotated one (named when they differ), boxes clipped to it and
    those left with no size dropped. Returns the usable records; ``notes`` gets the counts."""
    from ppmulti.rank.data.images import image_size
    from ppmulti.rank.data.yolo import scan_threads

    threads = scan_threads() if threads is None else max(1, threads)
    with ThreadPoolExecutor(threads) as pool:
        sizes = list(pool.map(lambda r: image_size(Path(r["im_file"])), records))
    kept = []
    for rec, size in zip(records, sizes):
        if isinstance(size, str):
            notes.skipped.append((rec["im_file"], size))
            continue
        w, h = size
        aw, ah = rec.get("w"), rec.get("h")
        if aw is not None and ah is not None and (round(float(aw)), round(float(ah))) != (w, h):
            notes.resized.append((rec["im_file"], round(float(aw)), round(float(ah)), w, h))
        rec["w"], rec["h"] = float(w), float(h)
        box = rec.get("gt_bbox")
        if box is not None and len(box):
            box = np.asarray(box, np.float32).reshape(-1, 4)
            clipped = np.clip(box, 0, np.array([w, h, w, h], np.float32))
            changed = (clipped != box).any(1)
            keep = (clipped[:, 2] - clipped[:, 0] > EPS) & (clipped[:, 3] - clipped[:, 1] > EPS)
            notes.clipped += int((changed & keep).sum())
            notes.dropped += int((~keep).sum())
            rec["gt_bbox"] = clipped[keep]
            for key in ("gt_class", "is_crowd", "difficult", "gt_score", "gt_track_id"):
                if key in rec and isinstance(rec[key], np.ndarray) and len(rec[key]) == len(keep):
                    rec[key] = rec[key][keep]
            if "gt_poly" in rec and isinstance(rec["gt_poly"], list) and len(rec["gt_poly"]) == len(keep):
                rec["gt_poly"] = [p for p, k in zip(rec["gt_poly"], keep) if k]
        kept.append(rec)
    return kept


def eval_ground_truth(data: dict, records: list[dict]) -> tuple[dict, ScanNotes]:
    """The ground truth an evaluation scores against, as the scan cleaned it: the json ``data`` (not changed)
    restricted to the images of ``records`` (the scan's usable ones, at their size as read), its boxes of no size
    dropped (ppdet's rule: no area, width or height) and the others clipped to their image, crowd boxes included.
    Returns the cleaned copy and what changed: images left out that had a box, boxes dropped and clipped."""
    notes = ScanNotes()
    kept = {}
    for rec in records:
        im_id = int(np.asarray(rec["im_id"]).reshape(-1)[0])
        kept[im_id] = (float(rec["w"]), float(rec["h"])) if "w" in rec and "h" in rec else None
    images = []
    for im in data.get("images") or []:
        if not isinstance(im, dict) or im.get("id") not in kept:
            continue
        size = kept[im["id"]]
        images.append(dict(im, width=round(size[0]), height=round(size[1])) if size else im)
    boxed: dict = {}   # images left out -> their file, when they had a box that counts
    files = {im.get("id"): im.get("file_name") for im in data.get("images") or [] if isinstance(im, dict)}
    annotations = []
    for inst in data.get("annotations") or []:
        if not isinstance(inst, dict):
            continue
        box = inst.get("bbox")
        try:
            x, y, w, h = (float(v) for v in box)
            area = float(inst.get("area", w * h))
        except (TypeError, ValueError):
            x = y = w = h = area = 0.0
        sized = area > 0 and w > EPS and h > EPS
        im_id = inst.get("image_id")
        if im_id not in kept:
            if sized and im_id in files:
                boxed[im_id] = files[im_id]
            continue
        if not sized:
            notes.dropped += 1
            continue
        if kept[im_id] is not None:
            iw, ih = kept[im_id]
            x1, x2 = (min(max(v, 0.0), iw) for v in (x, x + w))
            y1, y2 = (min(max(v, 0.0), ih) for v in (y, y + h))
            if (x1, y1, x2, y2) != (x, y, x + w, y + h):
                if not (x2 - x1 > EPS and y2 - y1 > EPS):
                    notes.dropped += 1
                    continue
                notes.clipped += 1
                # the area pycocotools ranks boxes by shrinks with the box (a segment's area in proportion)
                inst = dict(inst, bbox=[x1, y1, x2 - x1, y2 - y1], area=area * (x2 - x1) * (y2 - y1) / (w * h))
        annotations.append(inst)
    notes.skipped = [(str(f), "skipped at the scan") for f in boxed.values()]
    return dict(data, images=images, annotations=annotations), notes


def eval_line(notes: ScanNotes, anno: str) -> str | None:
    """The one line saying that an evaluation's ground truth is not the annotation file as written."""
    if not (notes.dropped or notes.clipped or notes.skipped):
        return None
    return (f"{anno}: evaluated against the annotations as the scan checked them, not as written: "
            f"{notes.dropped} box(es) of zero or negative width or height dropped, {notes.clipped} box(es) clipped "
            f"to their image, {len(notes.skipped)} image(s) with boxes skipped (see the scan's lines)")


_REPORTED: set[tuple[str, str]] = set()   # (json, what was said): an evaluation builds its dataset more than once


def report(notes: ScanNotes, where: str) -> None:
    for line in notes.lines(where):
        report_line(line, where)


def report_line(line: str, where: str = "") -> None:
    """A WARNING line of the scan, said once per process."""
    if (where, line) not in _REPORTED:
        _REPORTED.add((where, line))
        log.warning("%s", line)


def _to_arrays(dataset, records: list[dict], empty: list[dict], notes: ScanNotes) -> dict[str, np.ndarray]:
    rows = records + empty
    n = len(rows)

    def stack(key: str, width: int, dtype) -> np.ndarray:
        parts = [np.asarray(r.get(key, np.zeros((0, width))), dtype).reshape(-1, width) for r in rows]
        return np.concatenate(parts) if parts else np.zeros((0, width), dtype)

    cats = sorted(dataset.catid2clsid, key=dataset.catid2clsid.get)
    names = sorted(dataset.cname2cid, key=dataset.cname2cid.get)
    return {
        "im_file": np.array([r["im_file"] for r in rows], dtype=str).reshape(n),
        "im_id": np.array([int(r["im_id"][0]) for r in rows], np.int64).reshape(n),
        "hw": np.array([(r["h"], r["w"]) for r in rows], np.float64).reshape(n, 2),
        "counts": np.array([len(r.get("gt_bbox", ())) for r in rows], np.int64).reshape(n),
        "empty": np.array([False] * len(records) + [True] * len(empty), bool).reshape(n),
        "gt_bbox": stack("gt_bbox", 4, np.float32), "gt_class": stack("gt_class", 1, np.int32),
        "is_crowd": stack("is_crowd", 1, np.int32),
        "cat_ids": np.array(cats, np.int64), "cat_names": np.array(names, dtype=str),
        **notes.to_arrays(),
        "stamps": image_stamps([r["im_file"] for r in rows] + [p for p, _ in notes.skipped]),
    }


def image_stamps(files: list[str]) -> np.ndarray:
    """(size, mtime_ns) of every image the scan looked at, usable or not: an image replaced, mended or removed
    since makes the cache stale, as the YOLO scan's key does (a stat each: no image is opened)."""
    return np.array([cache.file_stamp(f) for f in files], np.int64).reshape(-1, 2)


def _stale(a: dict[str, np.ndarray]) -> bool:
    files = [str(f) for f in a["im_file"]] + [str(p) for p, _ in a["skipped"]]
    return not np.array_equal(image_stamps(files), a["stamps"])


def _check(a: dict[str, np.ndarray]) -> bool:
    keys = ("im_file", "im_id", "hw", "counts", "empty", "gt_bbox", "gt_class", "is_crowd", "cat_ids", "cat_names",
            *NOTE_FIELDS, "stamps")
    if any(k not in a for k in keys):
        return False
    n, m = len(a["im_file"]), int(a["counts"].sum())
    return (a["hw"].shape == (n, 2) and a["counts"].shape == (n,) and a["empty"].shape == (n,)
            and a["gt_bbox"].shape == (m, 4) and a["gt_class"].shape == (m, 1) and a["is_crowd"].shape == (m, 1)
            and len(a["cat_ids"]) == len(a["cat_names"]) and a["stamps"].shape == (n + len(a["skipped"]), 2))


def _from_arrays(dataset, a: dict[str, np.ndarray]) -> tuple[list[dict], list[dict]]:
    dataset.catid2clsid = {int(c): i for i, c in enumerate(a["cat_ids"])}
    dataset.cname2cid = {str(nm): i for i, nm in enumerate(a["cat_names"])}
    offsets = np.concatenate([[0], np.cumsum(a["counts"])])
    records, empty = [], []
    for i in range(len(a["im_file"])):
        lo, hi = offsets[i], offsets[i + 1]
        rec = {"im_file": str(a["im_file"][i]), "im_id": np.array([int(a["im_id"][i])]),
               "h": float(a["hw"][i, 0]), "w": float(a["hw"][i, 1])}
        for key in ("is_crowd", "gt_class", "gt_bbox"):
            if key in dataset.data_fields:
                rec[key] = a[key][lo:hi].copy()
        (empty if a["empty"][i] else records).append(rec)
    return records, empty


def _dataset_class():
    from ppdet.core.workspace import register, serializable
    from ppdet.data.source.coco import COCODataSet

    @register
    @serializable
    class CachedCOCODataSet(COCODataSet):
        """ppdet's COCODataSet whose parse (pycocotools, then a Python loop over every image) is kept beside the
        json (``<json>.ppmulti.cache``, or the user cache dir) while the json keeps its size and mtime."""

        def _checked_parse(self, anno: str, image_dir: str) -> ScanNotes:
            """ppdet's parse, with the json checked first (one line where it breaks) and the records checked
            after (check_records); what ppdet drops by itself is counted from the json."""
            notes = json_notes(load_json(anno), image_dir, self.load_crowd, "gt_bbox" in self.data_fields)
            super(CachedCOCODataSet, self).parse_dataset()
            if "image" in self.data_fields:
                self.roidbs = check_records(self.roidbs, notes)
                if not self.allow_empty and "gt_bbox" in self.data_fields:   # as ppdet's parse leaves them out
                    self.roidbs = [r for r in self.roidbs if len(r["gt_bbox"])]
            return notes

        def ground_truth(self) -> tuple[dict, str | None]:
            """What an evaluation scores against (eval_ground_truth of the json and this set's records) and the
            line saying how it differs from the file, or None."""
            anno = os.path.join(self.dataset_dir, self.anno_path)
            data, notes = eval_ground_truth(load_json(anno), self.roidbs)
            return data, eval_line(notes, anno)

        def parse_dataset(self):
            fields = set(self.data_fields)
            anno = os.path.join(self.dataset_dir, self.anno_path)
            image_dir = os.path.join(self.dataset_dir, self.image_dir) if self.image_dir else ""
            if not fields <= CACHED_FIELDS or not {"image", "gt_bbox"} <= fields or self.load_semantic:
                # polygons, track ids: ppdet's own parse every time, checked all the same
                report(self._checked_parse(anno, image_dir), anno)
                return
            size, mtime = cache.file_stamp(anno)
            key = hashlib.sha1(f"{CHECKS}|{os.path.abspath(anno)}|{size}|{mtime}|{image_dir}|{sorted(fields)}|"
                               f"{self.load_crowd}|{self.allow_empty}|{self.sample_num}".encode()).hexdigest()
            path = json_cache_path(anno)

            def compute() -> dict[str, np.ndarray]:
                saved_ratio, self.empty_ratio = self.empty_ratio, 1.0    # keep every empty record; sample below
                try:
                    notes = self._checked_parse(anno, image_dir)
                finally:
                    self.empty_ratio = saved_ratio
                records = [r for r in self.roidbs if len(r.get("gt_bbox", ())) or not self.allow_empty]
                empty = [r for r in self.roidbs if not (len(r.get("gt_bbox", ())) or not self.allow_empty)]
                return _to_arrays(self, records, empty, notes)

            arrays, how = cache.cached_arrays(path, key, compute, _check)
            if _stale(arrays):   # an image changed since the scan: scan again (once per node, as the first time)
                with cache.build_lock(path):
                    again = cache.read_arrays(path, key, _check)   # another rank may have rescanned meanwhile
                    if again is None or _stale(again):
                        again = compute()
                        cache.write_arrays(path, key, again)
                    arrays, how = again, "cache rescanned: an image changed"
            log.debug("%s: %s", anno, how)
            report(ScanNotes.from_arrays(arrays), anno)
            records, empty = _from_arrays(self, arrays)
            if not records and not empty:
                raise UserError(f"{anno}: no usable image (see the line above); check image_dir and the files")
            if self.allow_empty and empty:
                empty = self._sample_empty(empty, len(records))
            self.roidbs = records + empty

    return CachedCOCODataSet


def json_cache_path(anno: str) -> Path:
    p = Path(os.path.abspath(anno))
    if os.access(p.parent, os.W_OK | os.X_OK):
        return p.parent / (p.name + SUFFIX)
    digest = hashlib.sha1(str(p).encode()).hexdigest()[:20]
    from ppmulti.common import shm

    return shm.user_cache_dir() / "scan" / f"{p.stem}-{digest}{SUFFIX}"


_REGISTERED: dict[str, type] = {}


def register_dataset(name: str, make) -> type:
    """Register the dataset class ``make()`` builds with ppdet (workspace and ``ppdet.data.source``) as ``name``,
    once per process."""
    if name not in _REGISTERED:
        import ppdet.data.source as source

        _REGISTERED[name] = make()
        setattr(source, name, _REGISTERED[name])
    return _REGISTERED[name]


def swap_dataset(cfg, ppdet_name: str, name: str) -> None:
    """A config's ``ppdet_name`` train and eval sections read through ``name`` (the same arguments)."""
    for section in ("TrainDataset", "EvalDataset"):
        node = cfg.get(section)
        if node is not None and dict(node).get("name") == ppdet_name:
            node["name"] = name


def register_source():
    """Register ``CachedCOCODataSet`` with ppdet, once per process."""
    return register_dataset(NAME, _dataset_class)


def swap_in(cfg) -> None:
    """A config's COCODataSet train and eval sections read through the cache."""
    swap_dataset(cfg, "COCODataSet", NAME)
