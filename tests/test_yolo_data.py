"""YOLOv5-format datasets: the data yaml, label edge cases, corrupt images, and agreement with the COCO json."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest

from ppmulti.rank.data.yolo import (coco_json, image_names, label_path, load_data_yaml, read_labels, scan,
                                    use_data_yaml)
from ppmulti.common.errors import UserError


def _image(path, size=(32, 24)):
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, (90, 120, 150)).save(path)
    return path


def _yaml(tmp_path, text):
    p = tmp_path / "data.yaml"
    p.write_text(text)
    return p


def test_names_as_list_or_dict_and_nc(tmp_path):
    _image(tmp_path / "images" / "train" / "a.jpg")
    spec = load_data_yaml(_yaml(tmp_path, "train: images/train\nval: images/train\nnames: {0: cat, 1: dog}\n"))
    assert spec.names == ["cat", "dog"] and spec.nc == 2 and spec.root == tmp_path.resolve()
    spec = load_data_yaml(_yaml(tmp_path, "train: images/train\nnc: 2\n"))
    assert spec.names == ["class0", "class1"]
    with pytest.raises(UserError, match="nc: 3 but names lists 2"):
        load_data_yaml(_yaml(tmp_path, "train: images/train\nnc: 3\nnames: [a, b]\n"))
    with pytest.raises(UserError, match="keys 0..1"):
        load_data_yaml(_yaml(tmp_path, "train: images/train\nnames: {1: a, 2: b}\n"))


@pytest.mark.parametrize("text, message", [
    ("[1, 2]", "must be a mapping"),
    ("train: [unclosed\n", "not valid YAML"),
    ("names: [a]\n", "no train or val split"),
    ("train: images/train\nnames: [a]\nnc: -1\n", "positive integer"),
])
def test_invalid_data_yaml(tmp_path, text, message):
    with pytest.raises(UserError, match=message):
        load_data_yaml(_yaml(tmp_path, text))


def test_missing_data_yaml_and_split_directory(tmp_path):
    with pytest.raises(UserError, match="data yaml not found"):
        load_data_yaml(tmp_path / "nope.yaml")
    spec = load_data_yaml(_yaml(tmp_path, "train: images/missing\nnames: [a]\n"))
    with pytest.raises(UserError, match="images/missing does not exist"):
        image_files(spec, "train")


def test_a_listing_is_kept_until_a_directory_or_list_changes(tmp_path):
    """A split is listed once per process (a start asks three times): an image added to a sub-directory, an
    image removed, or a rewritten list file is seen by the next call."""
    import os

    a = _image(tmp_path / "images" / "train" / "a.jpg")
    (tmp_path / "list.txt").write_text("images/train/a.jpg\n")
    spec = load_data_yaml(_yaml(tmp_path, "train: images\nval: list.txt\nnames: [a]\n"))
    assert image_files(spec, "train") == [a] and image_files(spec, "train") == [a]
    b = _image(tmp_path / "images" / "train" / "deeper" / "b.jpg")
    assert image_files(spec, "train") == [a, b]
    os.unlink(a)
    assert image_files(spec, "train") == [b]
    assert image_files(spec, "val") == [a]
    (tmp_path / "list.txt").write_text("images/train/a.jpg\nimages/train/deeper/b.jpg\n")
    os.utime(tmp_path / "list.txt", ns=(1, 1))   # a different mtime even on a coarse clock
    assert image_files(spec, "val") == [a, b]


def image_files(spec, split):
    return [Path(p) for p in image_names(spec, split)]


def test_splits_as_directory_list_and_txt(tmp_path):
    a = _image(tmp_path / "images" / "train" / "a.jpg")
    b = _image(tmp_path / "images" / "extra" / "sub" / "b.png")
    (tmp_path / "list.txt").write_text("./images/train/a.jpg\n\nimages/extra/sub/b.png\n")
    spec = load_data_yaml(_yaml(tmp_path, "train: [images/train, images/extra]\nval: list.txt\nnames: [a]\n"))
    assert image_files(spec, "train") == [a, b]
    assert [p.resolve() for p in image_files(spec, "val")] == [a, b]
    assert label_path(b) == tmp_path / "labels" / "extra" / "sub" / "b.txt"


def test_labels_clipped_deduplicated_polygons_and_background(tmp_path):
    f = tmp_path / "l.txt"
    f.write_text("0 0.5 0.5 0.2 0.2\n0 0.5 0.5 0.2 0.2\n1 0.95 0.5 0.2 0.2\n1 0.1 0.1 0.3 0.1 0.2 0.4\n")
    rows, notes = read_labels(f, nc=2)
    assert notes.duplicates == 1 and notes.clipped == 1
    np.testing.assert_allclose(rows[1], [1, 0.85, 0.4, 1.0, 0.6], atol=1e-6)
    np.testing.assert_allclose(rows[2], [1, 0.1, 0.1, 0.3, 0.4], atol=1e-6)   # polygon -> its box
    empty = tmp_path / "e.txt"
    empty.write_text("\n")
    assert read_labels(empty, 2)[0].shape == (0, 5)
    assert read_labels(tmp_path / "missing.txt", 2)[0].shape == (0, 5)
    single, _ = read_labels(f, nc=2, single_cls=True)
    assert set(single[:, 0]) == {0.0}


@pytest.mark.parametrize("line, message", [
    ("3 0.5 0.5 0.1 0.1", "l.txt:2: class id 3 but the data yaml declares nc=2"),
    ("0 0.5 0.5 0.1", "l.txt:2: 4 values"),
    ("0 0.5 x 0.1 0.1", "l.txt:2: a value that is not a number"),
    ("0.5 0.5 0.5 0.1 0.1", "l.txt:2: class 0.5 that is not a non-negative integer"),
    ("0 0.5 0.5 -0.1 0.1", "l.txt:2: a negative width"),
])
def test_bad_label_lines_name_file_and_line(tmp_path, line, message):
    f = tmp_path / "l.txt"
    f.write_text("0 0.5 0.5 0.2 0.2\n" + line + "\n")
    with pytest.raises(UserError, match=message):
        read_labels(f, nc=2)


class _Lines(logging.Handler):
    def __init__(self):
        super().__init__(logging.INFO)
        self.lines: list[str] = []
        self.warnings: list[str] = []

    def emit(self, record):
        self.lines.append(record.getMessage())
        if record.levelno >= logging.WARNING:
            self.warnings.append(record.getMessage())


def test_corrupt_and_truncated_images_are_skipped_and_counted(tmp_path):
    good = _image(tmp_path / "images" / "train" / "good.jpg")
    (tmp_path / "labels" / "train").mkdir(parents=True)
    (tmp_path / "labels" / "train" / "good.txt").write_text("0 0.5 0.5 0.5 0.5\n")
    (tmp_path / "images" / "train" / "broken.jpg").write_bytes(b"not an image at all")
    truncated = tmp_path / "images" / "train" / "cut.jpg"
    truncated.write_bytes(good.read_bytes()[:-40])
    spec = load_data_yaml(_yaml(tmp_path, "train: images/train\nnames: [a]\n"))
    seen = _Lines()   # a handler of our own: earlier trainings in the session stop propagation to caplog
    logger = logging.getLogger("ppmulti")
    logger.addHandler(seen)
    try:
        records, report = scan(spec, "train")
    finally:
        logger.removeHandler(seen)
    assert len(records) == 1 and report.images == 1 and report.boxes == 1
    reasons = {path.split("/")[-1]: why for path, why in report.corrupt}
    assert reasons["broken.jpg"] == "unreadable (UnidentifiedImageError)"
    assert reasons["cut.jpg"] in ("truncated JPEG", "unreadable (OSError)")
    assert any("skipped 2 unusable image(s)" in line for line in seen.lines)
    np.testing.assert_allclose(records[0]["gt_bbox"], [[8, 6, 24, 18]])


def test_yolo_records_match_the_demo_coco_json(small_demo):
    spec = load_data_yaml(small_demo / "data.yaml")
    records, report = scan(spec, "val")
    ours = coco_json(records, spec.names)
    theirs = json.loads((small_demo / "annotations" / "instances_val.json").read_text())
    assert report.images == len(theirs["images"])
    assert len(ours["annotations"]) == len(theirs["annotations"])
    by_name = {}
    for a in theirs["annotations"]:
        name = next(i["file_name"] for i in theirs["images"] if i["id"] == a["image_id"])
        by_name.setdefault(name.split("/")[-1], []).append(a["bbox"])
    for rec in records:
        boxes = [[x1, y1, x2 - x1, y2 - y1] for x1, y1, x2, y2 in rec["gt_bbox"].tolist()]
        expected = by_name.get(rec["im_file"].split("/")[-1], [])
        np.testing.assert_allclose(sorted(boxes), sorted(expected), atol=0.01)


def test_use_data_yaml_sets_datasets_and_classes(small_demo, repo):
    from ppdet.core.workspace import create

    from ppmulti.rank import config

    cfg = config.load(repo / "configs" / "demo" / "ppyoloe_demo.yml")
    use_data_yaml(cfg, small_demo / "data.yaml", single_cls=True)
    assert cfg["num_classes"] == 1 and cfg["TrainDataset"]["name"] == "YOLODataSet"
    config.check_dataset(cfg, "TrainDataset")
    ev = create("EvalDataset")()
    ev.parse_dataset()
    assert "gt_bbox" not in ev.roidbs[0]          # eval batches carry images only
    from pycocotools.coco import COCO

    gt = COCO(ev.get_anno())
    assert len(gt.getImgIds()) == 16 and [c["name"] for c in gt.loadCats(gt.getCatIds())] == ["object"]


def test_fast_label_reader_matches_the_line_by_line_one(tmp_path, monkeypatch):
    from ppmulti.rank.data import yolo

    rng = np.random.default_rng(5)
    files = []
    for i in range(40):
        rows = rng.uniform(-0.2, 1.2, (int(rng.integers(0, 6)), 4))
        rows[:, 2:] = np.abs(rows[:, 2:]) * rng.integers(0, 2, (len(rows), 1))   # some zero-size boxes
        lines = [f"{int(rng.integers(0, 3))} " + " ".join(f"{x:.6f}" for x in r) for r in rows]
        lines += lines[:int(rng.integers(0, 2))]                                   # duplicates
        p = tmp_path / f"{i}.txt"
        p.write_text("\n".join(lines) + ("\n\n" if i % 2 else ""))
        files.append(p)
    fast = [yolo.read_labels(p, 3, single_cls=i % 3 == 0) for i, p in enumerate(files)]
    monkeypatch.setattr(yolo, "_read_boxes_fast", lambda *a: None)
    slow = [yolo.read_labels(p, 3, single_cls=i % 3 == 0) for i, p in enumerate(files)]
    for (a, na), (b, nb) in zip(fast, slow):
        np.testing.assert_array_equal(a, b)
        assert a.dtype == b.dtype == np.float32 and na == nb


def test_a_set_whose_labels_are_all_empty_is_a_warning(tmp_path):
    for name in ("a", "b"):
        _image(tmp_path / "images" / "train" / f"{name}.jpg")
        (tmp_path / "labels" / "train").mkdir(parents=True, exist_ok=True)
        (tmp_path / "labels" / "train" / f"{name}.txt").write_text("")
    spec = load_data_yaml(_yaml(tmp_path, "train: images/train\nnames: [a]\n"))
    seen = _Lines()
    logger = logging.getLogger("ppmulti")
    logger.addHandler(seen)
    try:
        records, report = scan(spec, "train", use_cache=False)
    finally:
        logger.removeHandler(seen)
    assert len(records) == 2 and report.boxes == 0
    first = str(tmp_path / "images" / "train" / "a.jpg")
    assert seen.warnings == [
        f"train: none of the 2 images has a box (every label file is empty or missing): the model would learn "
        f"that nothing is ever there; check that each image has its label file, e.g. {first} -> "
        f"{tmp_path / 'labels' / 'train' / 'a.txt'}, with lines 'class x_center y_center width height'"]


def test_the_files_ppdet_reads_by_path_stay_bounded(tmp_path, monkeypatch):
    """cache_text writes each text once; writing a new one removes those no run used for CACHE_DAYS, and a use
    keeps a file (its time renewed)."""
    import os
    import tempfile
    import time

    from ppmulti.rank.data.yolo import CACHE_DAYS, cache_text

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    old_time = time.time() - CACHE_DAYS * 86400 - 60
    unused = Path(cache_text("unused", "val", ".json"))
    used = Path(cache_text("used", "val", ".json"))
    for path in (unused, used):
        os.utime(path, (old_time, old_time))
    assert cache_text("used", "val", ".json") == str(used)            # a run asks for it again: kept
    assert used.stat().st_mtime > old_time
    fresh = Path(cache_text("another set", "val", ".json"))
    assert sorted(p.name for p in fresh.parent.iterdir()) == sorted([used.name, fresh.name])
    assert fresh.read_text() == "another set" and used.read_text() == "used"
