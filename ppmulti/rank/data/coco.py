"""COCO-json datasets whose parsed records are cached: ppdet's COCODataSet, parsed once per node and json."""

from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path

import numpy as np

from ppmulti.rank.data import cache

log = logging.getLogger("ppmulti")

NAME = "CachedCOCODataSet"
CACHED_FIELDS = {"image", "gt_bbox", "gt_class", "is_crowd"}   # what a detector trains on: plain arrays
SUFFIX = ".ppmulti.cache"


def _to_arrays(dataset, records: list[dict], empty: list[dict]) -> dict[str, np.ndarray]:
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
    }


def _check(a: dict[str, np.ndarray]) -> bool:
    keys = ("im_file", "im_id", "hw", "counts", "empty", "gt_bbox", "gt_class", "is_crowd", "cat_ids", "cat_names")
    if any(k not in a for k in keys):
        return False
    n, m = len(a["im_file"]), int(a["counts"].sum())
    return (a["hw"].shape == (n, 2) and a["counts"].shape == (n,) and a["empty"].shape == (n,)
            and a["gt_bbox"].shape == (m, 4) and a["gt_class"].shape == (m, 1) and a["is_crowd"].shape == (m, 1)
            and len(a["cat_ids"]) == len(a["cat_names"]))


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

        def parse_dataset(self):
            fields = set(self.data_fields)
            if not fields <= CACHED_FIELDS or not {"image", "gt_bbox"} <= fields or self.load_semantic:
                return super().parse_dataset()    # polygons, track ids: ppdet's own parse every time
            anno = os.path.join(self.dataset_dir, self.anno_path)
            size, mtime = cache.file_stamp(anno)
            image_dir = os.path.join(self.dataset_dir, self.image_dir) if self.image_dir else ""
            key = hashlib.sha1(f"{os.path.abspath(anno)}|{size}|{mtime}|{image_dir}|{sorted(fields)}|"
                               f"{self.load_crowd}|{self.allow_empty}|{self.sample_num}".encode()).hexdigest()
            path = json_cache_path(anno)

            def compute() -> dict[str, np.ndarray]:
                saved_ratio, self.empty_ratio = self.empty_ratio, 1.0    # keep every empty record; sample below
                try:
                    super(CachedCOCODataSet, self).parse_dataset()
                finally:
                    self.empty_ratio = saved_ratio
                records = [r for r in self.roidbs if len(r.get("gt_bbox", ())) or not self.allow_empty]
                empty = [r for r in self.roidbs if not (len(r.get("gt_bbox", ())) or not self.allow_empty)]
                return _to_arrays(self, records, empty)

            arrays, how = cache.cached_arrays(path, key, compute, _check)
            log.debug("%s: %s", anno, how)
            records, empty = _from_arrays(self, arrays)
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


_REGISTERED = None


def register_source():
    """Register ``CachedCOCODataSet`` with ppdet (workspace and ``ppdet.data.source``), once per process."""
    global _REGISTERED
    if _REGISTERED is None:
        import ppdet.data.source as source

        _REGISTERED = _dataset_class()
        setattr(source, NAME, _REGISTERED)
    return _REGISTERED


def swap_in(cfg) -> None:
    """A config's COCODataSet train and eval sections read through the cache (the same arguments)."""
    for section in ("TrainDataset", "EvalDataset"):
        node = cfg.get(section)
        if node is not None and dict(node).get("name") == "COCODataSet":
            node["name"] = NAME
