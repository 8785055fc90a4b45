"""The data set and the config agree on the classes before a run starts: num_classes against the categories."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from ppmulti.common.errors import UserError

log = logging.getLogger("ppmulti")

COCO_SOURCES = ("COCODataSet", "CachedCOCODataSet")
DATASET_KEYS = ("TrainDataset", "EvalDataset", "TestDataset")


@dataclass(frozen=True)
class DataClasses:
    """The classes a data set defines, in ppdet's class order (class k is ``ids[k]``), and where they were read."""

    where: str                  # e.g. "the training set's dataset/x/annotations/instances_train.json"
    ids: tuple[int, ...]
    names: tuple[str, ...]

    @property
    def count(self) -> int:
        return len(self.ids)

    def listing(self, most: int = 6) -> str:
        shown = ", ".join(self.names[:most])
        return shown + (f", ... ({self.count} in all)" if self.count > most else "")


@dataclass(frozen=True)
class Origin:
    """Where the config's num_classes came from; ``adoptable``: from a _BASE_ dataset file (e.g. ppdet's
    coco_detection.yml with its 80), which the data itself may correct."""

    where: str
    adoptable: bool = False


# ----------------------------------------------------------------------------- reading the data's classes
def _read_json(path: Path) -> dict:
    """The json read as the scan reads it: a broken one is the scan's line (where it breaks), whichever reads first."""
    from ppmulti.rank.data.coco import load_json

    return load_json(path)


def coco_classes(data: dict, where: str) -> DataClasses:
    """The categories of a loaded COCO json in ppdet's order (the list's order: ppdet numbers the classes by
    pycocotools' getCatIds, in training and in evaluation alike, so ids need not be 1..N nor sorted)."""
    cats = data.get("categories")
    if not cats:
        raise UserError(f"{where}: 'categories' is {'missing' if cats is None else 'empty'}; list the classes as "
                        f"\"categories\": [{{\"id\": 1, \"name\": \"...\"}}, ...]")
    if not isinstance(cats, list) or not all(isinstance(c, dict) and "id" in c for c in cats):
        raise UserError(f"{where}: 'categories' must be a list of {{\"id\": N, \"name\": \"...\"}}")
    ids = [c["id"] for c in cats]
    seen: set = set()
    for cid in ids:
        if cid in seen:
            # pycocotools keeps one entry per id, ppdet numbers every listed one: the class count would be off
            raise UserError(f"{where}: category id {cid} is listed twice in 'categories'; give each class one id")
        seen.add(cid)
    return DataClasses(where, tuple(ids), tuple(str(c.get("name", c["id"])) for c in cats))


def unknown_category(data: dict, classes: DataClasses) -> UserError | None:
    """An annotation whose category_id is not among the categories (ppdet's parse dies on it with a KeyError)."""
    known = set(classes.ids)
    bad = [a for a in data.get("annotations") or [] if isinstance(a, dict) and a.get("category_id") not in known]
    if not bad:
        return None
    first = bad[0]
    return UserError(f"{classes.where}: {len(bad)} annotation(s) have a category_id that 'categories' does not "
                     f"list, e.g. annotation {first.get('id')} (image {first.get('image_id')}) with category_id "
                     f"{first.get('category_id')!r}; the categories are ids {list(classes.ids)[:12]}: add the "
                     f"category or fix the annotations")


def _coco_path(section) -> Path | None:
    anno = section.get("anno_path")
    if not anno:
        return None
    return Path(section.get("dataset_dir") or ".") / str(anno)


def _what(section_name: str) -> str:
    return {"TrainDataset": "the training set", "EvalDataset": "the validation set"}.get(section_name, section_name)


def section_classes(cfg, section_name: str, check_annotations: bool = True) -> DataClasses | None:
    """The classes of a config's dataset section, read from its files (a COCO json, or a YOLOv5 data yaml);
    None for other sources or files that are not there (check_dataset names those)."""
    section = cfg.get(section_name)
    if section is None:
        return None
    name = section.get("name")
    if name == "YOLODataSet":
        from ppmulti.rank.data.yolo import load_data_yaml

        spec = load_data_yaml(section.get("data") or "")
        names = ["object"] if section.get("single_cls") else list(spec.names)
        return DataClasses(f"{_what(section_name)}'s {spec.yaml_path}", tuple(range(1, len(names) + 1)),
                           tuple(names))
    if name not in COCO_SOURCES:
        return None
    read = _coco_file(section, section_name)
    if read is None:
        return None
    data, classes = read
    if check_annotations:
        err = unknown_category(data, classes)
        if err is not None:
            raise err
    return classes


def _coco_file(section, section_name: str) -> tuple[dict, DataClasses] | None:
    """A COCO section's annotation json and its classes; None when the file is not there."""
    path = _coco_path(section)
    if path is None or not path.is_file():
        return None
    data = _read_json(path)
    return data, coco_classes(data, f"{_what(section_name)}'s {path}")


def dataset_classes(dataset, section_name: str, section=None) -> DataClasses | None:
    """The classes of a parsed ppdet dataset (its catid2clsid), named by its annotation file."""
    mapping = getattr(dataset, "catid2clsid", None)
    if not isinstance(mapping, dict):
        return None
    spec = getattr(dataset, "spec", None)
    if spec is not None:
        where = f"{_what(section_name)}'s {spec.yaml_path}"
    else:
        anno = _coco_path(section or {}) if section is not None else None
        where = f"{_what(section_name)}'s {anno}" if anno else _what(section_name)
    if not mapping:
        raise UserError(f"{where}: the data set defines no categories; list the classes "
                        f"(COCO: \"categories\": [{{\"id\": 1, \"name\": \"...\"}}, ...]; YOLOv5: names)")
    order = sorted(mapping, key=mapping.get)
    names_by_cls = {v: k for k, v in (getattr(dataset, "cname2cid", None) or {}).items()}
    return DataClasses(where, tuple(order), tuple(str(names_by_cls.get(mapping[c], c)) for c in order))


def explain_parse_error(cfg, section_name: str) -> UserError | None:
    """After ppdet's COCO parse died with a KeyError: the annotation that names an unknown category, if that
    was the cause (read here only on this failure path)."""
    section = cfg.get(section_name)
    if section is None or section.get("name") not in COCO_SOURCES:
        return None
    read = _coco_file(section, section_name)
    return None if read is None else unknown_category(*read)


def max_label(dataset) -> int:
    """The largest class id among a parsed dataset's ground truth (-1 without any)."""
    import numpy as np

    top = -1
    for rec in getattr(dataset, "roidbs", None) or []:
        cls = rec.get("gt_class") if isinstance(rec, dict) else None
        if cls is not None and len(cls):
            top = max(top, int(np.max(cls)))
    return top


# ----------------------------------------------------------------------------- where num_classes came from
def _load_yaml(path: Path) -> dict:
    import yaml

    from ppmulti.common import yamlread

    try:
        data = yaml.load(path.read_text(), Loader=yamlread._yaml_loader()) or {}
    except (OSError, yaml.YAMLError):
        return {}
    return data if isinstance(data, dict) else {}


def _setter(path: Path, key: str, depth: int = 0) -> Path | None:
    """The file of a _BASE_ chain whose ``key`` wins the merge (the file itself over its bases, later bases
    over earlier ones), or None when none sets it."""
    if depth > 20:
        return None
    data = _load_yaml(path)
    if key in data:
        return path
    bases = data.get("_BASE_") or []
    found = None
    for base in [bases] if isinstance(bases, str) else bases:
        hit = _setter(path.parent / str(base), key, depth + 1)
        if hit is not None:
            found = hit
    return found


def _override_keys(overrides: Iterable[str] | dict | None) -> dict:
    if isinstance(overrides, dict):
        return overrides
    from ppmulti.common.flags import parse_overrides

    return parse_overrides(list(overrides or []))


def num_classes_origin(config: str | os.PathLike, overrides: Iterable[str] | dict | None = None,
                       edited_by: str | None = None) -> Origin:
    """Where a loaded config's num_classes came from: ``-o``, a flag that edited the config (``edited_by``),
    the config file itself, or a _BASE_ file; adoptable only from a _BASE_ dataset file (one that also
    describes a dataset section), whose value stands for a data set the user has since pointed elsewhere."""
    over = _override_keys(overrides)
    if "num_classes" in over:
        return Origin(f"-o num_classes={over['num_classes']}")
    if edited_by:
        return Origin(edited_by)
    top = Path(config)
    found = _setter(top, "num_classes")
    if found is None:
        return Origin("the model's default")
    if found.resolve() == top.resolve():
        return Origin(str(top))
    base = _load_yaml(found)
    return Origin(f"{os.path.normpath(found)} (a _BASE_ file)", adoptable=any(k in base for k in DATASET_KEYS))


# ----------------------------------------------------------------------------- the checks
def _fix(num: int, config: str) -> str:
    return f"give -o num_classes={num} (or set num_classes: {num} in {config})"


def agree_train(cfg, classes: DataClasses | None, origin: Origin, config: str, top_label: int = -1) -> list[str]:
    """The training set's classes against num_classes: equal, or num_classes taken from the data when its value
    came from a _BASE_ dataset file (returns the line saying so), else a UserError naming both and the fix."""
    num = int(cfg.get("num_classes") or 0)
    notes: list[str] = []
    if classes is not None and classes.count != num:
        if origin.adoptable:
            cfg["num_classes"] = classes.count
            notes.append(f"num_classes {num} comes from {origin.where} but {classes.where} has {classes.count} "
                         f"categories ({classes.listing()}): training with num_classes={classes.count}, taken "
                         f"from the data; -o num_classes=N or num_classes in {config} sets it")
            num = classes.count
        else:
            raise UserError(f"num_classes {num} (from {origin.where}) does not match the {classes.count} categories "
                            f"of {classes.where} ({classes.listing()}); {_fix(classes.count, config)}")
    if top_label >= num:
        where = classes.where if classes is not None else "the training set"
        raise UserError(f"{where} has class id {top_label} but num_classes is {num} (from {origin.where}; ids "
                        f"0..{num - 1}); {_fix(top_label + 1, config)} or fix the labels")
    return notes


def agree_eval(cfg, train: DataClasses | None, config: str, origin: Origin | None = None) -> None:
    """The validation set's classes against num_classes and against the training set's (class k must mean the
    same category in both, or the model's class k is scored as another one): a UserError at start, where
    ppdet's evaluation would fail after an epoch (``KeyError`` in json_results) or score the wrong classes."""
    section = cfg.get("EvalDataset")
    if section is None or not dict(section):
        return
    val = section_classes(cfg, "EvalDataset")
    if val is None:
        return
    num = int(cfg.get("num_classes") or 0)
    if train is not None and train.ids != val.ids:
        raise UserError(f"{val.where} lists the categories {list(val.ids)[:12]} ({val.listing()}) but "
                        f"{train.where} lists {list(train.ids)[:12]} ({train.listing()}): class k must be the same "
                        f"category in both; give both files the same 'categories' list, in the same order")
    if val.count != num:
        src = f" (from {origin.where})" if origin is not None else ""
        raise UserError(f"num_classes {num}{src} does not match the {val.count} categories of {val.where} "
                        f"({val.listing()}); {_fix(val.count, config)}")


def agree_weights_data(cfg: Any, config: str) -> None:
    """tools/eval.py: the evaluated data's categories against the model's num_classes (no adoption: the weights
    fix the class count)."""
    agree_eval(cfg, None, config, Origin("the config"))
