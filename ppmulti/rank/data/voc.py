"""VOC datasets checked at the scan as COCO and YOLO data are: ppdet's VOCDataSet with its XML files checked (a
broken one is one line with where it breaks), unusable images skipped and named, boxes dropped or clipped counted,
annotated sizes that are not the image's as read named."""

from __future__ import annotations

import logging
import os
import xml.etree.ElementTree as ET

from ppmulti.common.errors import UserError
from ppmulti.rank.data.coco import ScanNotes, check_records, register_dataset, report, swap_dataset

log = logging.getLogger("ppmulti")

NAME = "CheckedVOCDataSet"


def _number(node, tag: str) -> float | None:
    found = node.find(tag) if node is not None else None
    try:
        return float(found.text)
    except (AttributeError, TypeError, ValueError):
        return None


def list_notes(anno_list: str, image_dir: str, boxes: bool = True) -> ScanNotes:
    """Every XML of a VOC list parsed before ppdet's parse: a broken one is a UserError naming the file, line and
    column; images and XML files missing (which ppdet skips without a word reaching the log) are counted, and
    (with ``boxes``) the boxes ppdet drops (no width or height once clipped to the annotated size) or clips."""
    notes = ScanNotes()
    try:
        with open(anno_list) as f:
            lines = [ln.split() for ln in f if ln.strip()]
    except OSError as exc:
        raise UserError(f"{anno_list}: cannot be read ({exc.strerror or exc})") from None
    for words in lines:
        if len(words) < 2:
            raise UserError(f"{anno_list}: the line {' '.join(words)!r} must name an image and its XML file")
        image, xml = (os.path.join(image_dir, w) for w in words[:2])
        if not os.path.exists(image):
            notes.skipped.append((image, "missing"))
            continue
        if not os.path.isfile(xml):
            notes.skipped.append((image, f"no annotation file {xml}"))
            continue
        try:
            tree = ET.parse(xml)
        except ET.ParseError as exc:
            line, column = exc.position
            raise UserError(f"{xml}: not valid XML at line {line} column {column + 1} "
                            f"({str(exc).split(':')[0]}): the file is cut short or damaged; restore or regenerate "
                            f"it") from None
        if not boxes:
            continue
        size = tree.find("size")
        w, h = _number(size, "width"), _number(size, "height")
        if w is None or h is None:
            continue   # ppdet's own parse fails on it and says why
        for obj in tree.findall("object"):
            box = obj.find("bndbox")
            x1, y1, x2, y2 = (_number(box, t) for t in ("xmin", "ymin", "xmax", "ymax"))
            if None in (x1, y1, x2, y2):
                continue
            # ppdet's rule: clipped to the annotated size (minus one), dropped when nothing is left
            cx1, cy1, cx2, cy2 = max(0, x1), max(0, y1), min(w - 1, x2), min(h - 1, y2)
            if not (cx2 > cx1 and cy2 > cy1):
                notes.dropped += 1
            elif (cx1, cy1, cx2, cy2) != (x1, y1, x2, y2):
                notes.clipped += 1
    return notes


def _dataset_class():
    from ppdet.core.workspace import register, serializable
    from ppdet.data.source.voc import VOCDataSet

    @register
    @serializable
    class CheckedVOCDataSet(VOCDataSet):
        """ppdet's VOCDataSet, its files checked first and its records after (no scan cache: ppdet parses a VOC
        list at every start, and so do these checks, which therefore say the same each time)."""

        def parse_dataset(self):
            anno = os.path.join(self.dataset_dir, self.anno_path)
            image_dir = os.path.join(self.dataset_dir, self.image_dir)
            notes = list_notes(anno, image_dir, "gt_bbox" in self.data_fields)
            super().parse_dataset()
            if "image" in self.data_fields:
                self.roidbs = check_records(self.roidbs, notes)
            report(notes, anno)
            if not self.roidbs:
                raise UserError(f"{anno}: no usable image (see the line above); check image_dir and the files")

    return CheckedVOCDataSet


def register_source():
    """Register ``CheckedVOCDataSet`` with ppdet, once per process."""
    return register_dataset(NAME, _dataset_class)


def swap_in(cfg) -> None:
    """A config's VOCDataSet train and eval sections read through the checks."""
    swap_dataset(cfg, "VOCDataSet", NAME)
