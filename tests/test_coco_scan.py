"""COCO- and VOC-format data checked at the scan as YOLO data is (issue 45): a broken json or XML is one line with
where it breaks, unusable images are skipped and named, boxes of no size dropped and boxes outside the image
clipped, an annotated size that is not the image's as read (EXIF orientation applied) named; the COCO scan cache
keeps it all, so a second start says the same. Every data set is written here, with PIL."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import DEMO_CONFIG, REPO, demo_overrides
from ppmulti.common.errors import UserError

FIELDS = ["image", "gt_bbox", "gt_class", "is_crowd"]


def _photo(path: Path, size: tuple[int, int], orientation: int | None = None) -> None:
    from PIL import Image

    rng = np.random.default_rng(len(path.name))
    im = Image.fromarray(rng.integers(0, 255, (size[1], size[0], 3), dtype=np.uint8))
    if orientation is None:
        im.save(path)
    else:
        exif = Image.Exif()
        exif[0x0112] = orientation   # 6: the camera was turned; viewers show the picture rotated 90 degrees
        im.save(path, exif=exif.tobytes())


def write_set(root: Path) -> Path:
    """8 images listed: 5 good 64x64, a text file named .jpg, one missing from disk, and a photo stored 64x96 with
    EXIF orientation 6 (shown and decoded 96x64) whose annotation gives its stored size. Boxes: one good box per
    image, plus one of width 0, one of negative height and one starting at negative x, y (reaching outside)."""
    images = root / "images" / "train"
    images.mkdir(parents=True)
    entries, annotations = [], []

    def add(name: str, w: int, h: int, boxes: list[list[float]]) -> None:
        im_id = len(entries) + 1
        entries.append({"id": im_id, "file_name": name, "width": w, "height": h})
        for box in boxes:
            annotations.append({"id": len(annotations) + 1, "image_id": im_id, "category_id": 1, "bbox": box,
                                "area": box[2] * box[3], "iscrowd": 0})

    for i in range(5):
        _photo(images / f"{i}.jpg", (64, 64))
    add("0.jpg", 64, 64, [[8, 8, 20, 20], [5, 5, 0, 10]])      # + width 0
    add("1.jpg", 64, 64, [[8, 8, 20, 20], [5, 20, 10, -5]])    # + negative height
    add("2.jpg", 64, 64, [[-8, -4, 20, 20]])                   # reaches outside: clipped to 0,0,12,16
    add("3.jpg", 64, 64, [[30, 30, 20, 20]])
    add("4.jpg", 64, 64, [[10, 30, 30, 20]])
    (images / "notes.jpg").write_text("this is a text file, not a picture\n")
    add("notes.jpg", 64, 64, [[8, 8, 20, 20]])
    add("gone.jpg", 64, 64, [[8, 8, 20, 20]])
    _photo(images / "photo.jpg", (64, 96), orientation=6)
    add("photo.jpg", 64, 96, [[10, 10, 30, 40]])               # the stored size, not the size as displayed
    anno = root / "annotations"
    anno.mkdir()
    content = {"info": {"description": "issue 45"}, "licenses": [], "images": entries, "annotations": annotations,
               "categories": [{"id": 1, "name": "thing", "supercategory": "none"}]}
    for split in ("train", "val"):
        (anno / f"instances_{split}.json").write_text(json.dumps(content, indent=1))
    (root / "images" / "val").symlink_to("train")
    return anno / "instances_train.json"


def expected_lines(root: Path) -> list[str]:
    anno, images = root / "annotations" / "instances_train.json", root / "images" / "train"
    return [
        f"{anno}: skipped 2 image(s) that cannot be used: {images}/gone.jpg (missing), {images}/notes.jpg "
        f"(unreadable (UnidentifiedImageError))",
        f"{anno}: 2 box(es) of zero or negative width or height dropped, 1 box(es) reaching outside their image "
        f"clipped to it",
        f"{anno}: 1 image(s) whose width/height in the annotations differ from the image as read (EXIF orientation "
        f"applied): {images}/photo.jpg (annotated 64x96, read 96x64); their boxes are clipped to the image as read: "
        f"check that the annotations were made on the image as displayed",
    ]


@pytest.fixture
def user_cache(tmp_path, monkeypatch):
    from ppmulti.common.envvars import XDG_CACHE_HOME

    monkeypatch.setenv(XDG_CACHE_HOME, str(tmp_path / "usercache"))


class _Warnings(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record):
        self.lines.append(record.getMessage())


def _parse(root: Path):
    from ppmulti.rank import compat

    compat.import_ppdet()
    from ppmulti.rank.data import coco

    coco._REPORTED.clear()   # a line is said once per process: each parse here stands for a new start
    ds = coco.register_source()(dataset_dir=str(root), image_dir="images/train",
                                anno_path="annotations/instances_train.json", data_fields=FIELDS, allow_empty=True)
    seen = _Warnings()
    logger = logging.getLogger("ppmulti")
    logger.addHandler(seen)
    try:
        ds.parse_dataset()
    finally:
        logger.removeHandler(seen)
    return ds, seen.lines


def test_a_coco_set_is_checked_at_the_scan_and_its_cache_says_the_same(tmp_path, user_cache, monkeypatch):
    from ppmulti.rank.data import coco

    checked = []
    real = coco.check_records
    monkeypatch.setattr(coco, "check_records", lambda *a: checked.append(1) or real(*a))
    root = tmp_path / "set"
    anno = write_set(root)
    first, lines = _parse(root)
    assert lines == expected_lines(root)
    assert (anno.parent / (anno.name + ".ppmulti.cache")).is_file()
    second, again = _parse(root)   # read from the scan cache: the same lines, the same records
    assert again == lines and len(checked) == 1   # the images were opened once
    # the text file named .jpg replaced by a picture: the cache follows the image, not only the json
    _photo(root / "images" / "train" / "notes.jpg", (64, 64))
    mended, after = _parse(root)
    assert len(checked) == 2 and len(mended.roidbs) == 7
    assert after[0] == f"{anno}: skipped 1 image(s) that cannot be used: {root}/images/train/gone.jpg (missing)"
    for ds in (first, second):
        by_name = {Path(r["im_file"]).name: r for r in ds.roidbs}
        assert sorted(by_name) == ["0.jpg", "1.jpg", "2.jpg", "3.jpg", "4.jpg", "photo.jpg"]
        assert all(len(r["gt_bbox"]) == 1 for r in ds.roidbs)
        np.testing.assert_allclose(by_name["2.jpg"]["gt_bbox"], [[0, 0, 12, 16]])
        assert (by_name["photo.jpg"]["w"], by_name["photo.jpg"]["h"]) == (96.0, 64.0)   # as displayed and decoded


def test_ppdets_decode_reads_a_photo_as_displayed(tmp_path):
    """ppdet's Decode (cv2.imdecode) applies the EXIF orientation itself (measured 2026-12-01 with
    opencv-python 4.5.5.64, the Paddle 2.6 stack's, and 5.0.0.93: both decode this photo as 64 rows x 96 columns):
    with the scan's size as read in the record, ppdet's "actual image height ... is not equal" warning no longer
    fires. This test holds it, should a later OpenCV or ppdet stop rotating."""
    from ppmulti.rank import compat

    compat.import_ppdet()
    from ppdet.data.transform.operators import Decode

    _photo(tmp_path / "photo.jpg", (64, 96), orientation=6)
    sample = Decode()({"im_file": str(tmp_path / "photo.jpg"), "h": 64.0, "w": 96.0})
    assert sample["image"].shape == (64, 96, 3) and (sample["h"], sample["w"]) == (64, 96)


@pytest.mark.parametrize("cut, where", [
    (0.5, None),                                  # instances_train.json cut in half: the line/column where it ends
    ("{\n \"images\": [\n  {\"id\": 1,,}\n", "line 3 column 12 (Expecting property name enclosed in double quotes)"),
])
def test_a_broken_annotation_file_is_one_line_naming_where(tmp_path, user_cache, cut, where):
    root = tmp_path / "set"
    anno = write_set(root)
    text = anno.read_text()
    if isinstance(cut, float):
        text = text[:int(len(text) * cut)]
        lines = text.splitlines()
        # json's own count for a file cut mid-stream: the end of the text (checked below against the message)
        where = f"line {len(lines)} column "
    else:
        text = cut
    anno.write_text(text)
    with pytest.raises(UserError) as exc:
        _parse(root)
    message = str(exc.value)
    assert message.startswith(f"{anno}: not valid JSON at {where}"), message
    assert message.endswith(": the file is cut short or damaged; restore or regenerate it")


def _score_raw(anno: Path, detections: list[dict]) -> tuple[float, float]:
    """(mAP50-95, mAP50) of detections against the annotation file as written, by pycocotools alone: what the
    evaluator scored against before it took the scan's ground truth."""
    import contextlib
    import io

    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    with contextlib.redirect_stdout(io.StringIO()):
        gt = COCO(str(anno))
        ev = COCOeval(gt, gt.loadRes([dict(d) for d in detections]), "bbox")
        ev.evaluate()
        ev.accumulate()
        ev.summarize()
    return float(ev.stats[0]), float(ev.stats[1])


def test_the_evaluation_scores_against_the_ground_truth_the_scan_checked(tmp_path, user_cache):
    """A perfect model (one detection on each box the scan kept, as the loader gives them) scores 1.0 against the
    scan's ground truth; against the file as written the same detections score 0.5 (mAP50 and mAP50-95): the box
    of width 0 can never be matched, the box reaching outside is matched by no detection inside the image (IoU
    0.48), the boxes of the unusable images are missed. One WARNING line says so."""
    from ppmulti.rank.engine.evaluator import CocoEvaluator

    root = tmp_path / "set"
    anno = write_set(root)
    from ppmulti.rank import compat

    compat.import_ppdet()
    from ppmulti.rank.data import coco

    coco._REPORTED.clear()
    # as evaluation configs read a COCO set (configs/datasets/coco_detection.yml): images only, empty ones kept
    ds = coco.register_source()(dataset_dir=str(root), image_dir="images/train",
                                anno_path="annotations/instances_train.json", allow_empty=True)
    ds.parse_dataset()
    assert sorted(Path(r["im_file"]).name for r in ds.roidbs) == ["0.jpg", "1.jpg", "2.jpg", "3.jpg", "4.jpg",
                                                                  "photo.jpg"]
    data = json.loads(anno.read_text())
    kept = {int(r["im_id"][0]) for r in ds.roidbs}
    detections = []
    for a in data["annotations"]:
        x, y, w, h = a["bbox"]
        if a["image_id"] in kept and w > 0 and h > 0:
            x1, y1 = max(x, 0), max(y, 0)   # 2.jpg's box as the image holds it
            detections.append({"image_id": a["image_id"], "category_id": 1, "bbox": [x1, y1, x + w - x1, y + h - y1],
                               "score": 0.9})
    raw = _score_raw(anno, detections)
    assert raw == pytest.approx((0.5, 0.5), abs=1e-3), raw   # measured: pycocotools 2.0.11 and 2.0.10

    ev = CocoEvaluator.__new__(CocoEvaluator)   # the scoring alone: no model, no loader
    ev.dataset, ev.anno_file, ev._coco_gt, ev._labels = ds, ds.get_anno(), None, None
    ev.catid2clsid = dict(ds.catid2clsid)
    ev.clsid2catid = {v: k for k, v in ev.catid2clsid.items()}
    seen = _Warnings()
    logger = logging.getLogger("ppmulti")
    logger.addHandler(seen)
    try:
        m50_95, m50, _ = ev.score(detections)
        ev.score(detections)   # said once
    finally:
        logger.removeHandler(seen)
    assert (m50_95, m50) == (1.0, 1.0)
    assert ev.diagnose(detections).means()["recall"] == 1.0   # YOLOv5's table reads the same ground truth
    assert seen.lines == [f"{anno}: evaluated against the annotations as the scan checked them, not as written: "
                          f"2 box(es) of zero or negative width or height dropped, 1 box(es) clipped to their "
                          f"image, 2 image(s) with boxes skipped (see the scan's lines)"]
    assert ev._gt().loadAnns(ev._gt().getAnnIds(imgIds=[3]))[0]["bbox"] == [0.0, 0.0, 12.0, 16.0]
    assert json.loads(anno.read_text()) == data   # the file is left as it is


def _train(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    from launching import launch_env

    return subprocess.run([sys.executable, str(REPO / "tools" / "train.py"), *args], cwd=cwd, capture_output=True,
                          text=True, timeout=600, env=launch_env())


def test_a_cut_annotation_file_stops_the_training_entry_in_one_line(tmp_path):
    root = tmp_path / "set"
    anno = write_set(root)
    anno.write_text('{\n "images": [\n  {"id": 1, "file_name"')
    proc = _train(["-c", str(DEMO_CONFIG), "--epochs", "1", "-o", *demo_overrides(root, 64)], tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    errors = [ln for ln in proc.stderr.splitlines() if "error" in ln.lower()]
    assert errors == [f"error: {anno}: not valid JSON at line 3 column 24 (Expecting ':' delimiter): the file is "
                      f"cut short or damaged; restore or regenerate it"], proc.stderr[-3000:]


@pytest.mark.slow
def test_a_faulty_coco_set_trains_one_step_with_each_fault_said_once(tmp_path):
    """tools/train.py on the faulty set: one step, the scan's three lines on the console, nothing from ppdet's
    Decode about sizes, no traceback; a second start (scan cache) prints the same three lines. The evaluation
    says that it scores against the checked annotations."""
    root = tmp_path / "set"
    write_set(root)
    args = ["-c", str(DEMO_CONFIG), "--epochs", "1", "-o", *demo_overrides(root, 64), "TrainReader.batch_size=6",
            "worker_num=0"]
    seen = []
    for _ in range(2):
        proc = _train(args, tmp_path)
        out = proc.stdout + proc.stderr
        assert proc.returncode == 0 and "Traceback" not in out, out[-3000:]
        seen.append([ln.split(" WARNING ", 1)[1] for ln in out.splitlines()
                     if f" WARNING {root}/annotations/instances_" in ln])
        assert "is not equal to the" not in out   # ppdet's Decode found the record's size right
    # the validation set (the same json and images) is checked too: its unusable images, its sizes
    val = [line.replace("instances_train", "instances_val").replace("images/train", "images/val")
           for line in expected_lines(root)]
    # and its evaluation scores against the ground truth the scan checked: the same drops, clipping and skips
    scored = (f"{root}/annotations/instances_val.json: evaluated against the annotations as the scan checked them, "
              f"not as written: 2 box(es) of zero or negative width or height dropped, 1 box(es) clipped to their "
              f"image, 2 image(s) with boxes skipped (see the scan's lines)")
    assert seen[0] == seen[1] == expected_lines(root) + [val[0], val[2], scored], out[-3000:]


# ----------------------------------------------------------------------------------------------------------- VOC
def _xml(name: str, w: int, h: int, boxes: list[list[float]]) -> str:
    objects = "".join(f"<object><name>thing</name><difficult>0</difficult><bndbox><xmin>{b[0]}</xmin>"
                      f"<ymin>{b[1]}</ymin><xmax>{b[2]}</xmax><ymax>{b[3]}</ymax></bndbox></object>\n" for b in boxes)
    return (f"<annotation>\n<filename>{name}</filename>\n<size><width>{w}</width><height>{h}</height>"
            f"<depth>3</depth></size>\n{objects}</annotation>\n")


def write_voc(root: Path) -> None:
    """The COCO set's faults in VOC's layout (x1 y1 x2 y2 boxes): 3 good images, a text file named .jpg, one
    missing, the EXIF photo annotated with its stored size; a box of width 0, one of negative height, one
    reaching outside."""
    (root / "JPEGImages").mkdir(parents=True)
    (root / "Annotations").mkdir()
    items = {"0": (64, 64, [[8, 8, 28, 28], [5, 5, 5, 15]]), "1": (64, 64, [[8, 8, 28, 28], [5, 20, 15, 15]]),
             "2": (64, 64, [[-8, -4, 12, 16]]), "notes": (64, 64, [[8, 8, 28, 28]]),
             "gone": (64, 64, [[8, 8, 28, 28]]), "photo": (64, 96, [[10, 10, 40, 50]])}
    for i in "012":
        _photo(root / "JPEGImages" / f"{i}.jpg", (64, 64))
    (root / "JPEGImages" / "notes.jpg").write_text("not a picture\n")
    _photo(root / "JPEGImages" / "photo.jpg", (64, 96), orientation=6)
    for stem, (w, h, boxes) in items.items():
        (root / "Annotations" / f"{stem}.xml").write_text(_xml(f"{stem}.jpg", w, h, boxes))
    (root / "trainval.txt").write_text("".join(f"JPEGImages/{s}.jpg Annotations/{s}.xml\n" for s in items))
    (root / "label_list.txt").write_text("thing\n")


def _parse_voc(root: Path):
    from ppmulti.rank import compat

    compat.import_ppdet()
    from ppmulti.rank.data import coco, voc

    coco._REPORTED.clear()
    ds = voc.register_source()(dataset_dir=str(root), image_dir="", anno_path="trainval.txt",
                               label_list="label_list.txt", data_fields=["image", "gt_bbox", "gt_class", "difficult"])
    seen = _Warnings()
    logger = logging.getLogger("ppmulti")
    logger.addHandler(seen)
    try:
        ds.parse_dataset()
    finally:
        logger.removeHandler(seen)
    return ds, seen.lines


def test_a_voc_set_is_checked_at_the_scan(tmp_path):
    root = tmp_path / "voc"
    write_voc(root)
    ds, lines = _parse_voc(root)
    anno, images = root / "trainval.txt", root / "JPEGImages"
    assert lines == [
        f"{anno}: skipped 2 image(s) that cannot be used: {images}/gone.jpg (missing), {images}/notes.jpg "
        f"(unreadable (UnidentifiedImageError))",
        f"{anno}: 2 box(es) of zero or negative width or height dropped, 1 box(es) reaching outside their image "
        f"clipped to it",
        f"{anno}: 1 image(s) whose width/height in the annotations differ from the image as read (EXIF orientation "
        f"applied): {images}/photo.jpg (annotated 64x96, read 96x64); their boxes are clipped to the image as read: "
        f"check that the annotations were made on the image as displayed"]
    by_name = {Path(r["im_file"]).name: r for r in ds.roidbs}
    assert sorted(by_name) == ["0.jpg", "1.jpg", "2.jpg", "photo.jpg"]
    assert [len(r["gt_bbox"]) for r in ds.roidbs] == [1, 1, 1, 1]
    np.testing.assert_allclose(by_name["2.jpg"]["gt_bbox"], [[0, 0, 12, 16]])
    assert _parse_voc(root)[1] == lines   # every start checks again and says the same


def test_a_cut_voc_xml_is_one_line_naming_where(tmp_path):
    root = tmp_path / "voc"
    write_voc(root)
    xml = root / "Annotations" / "1.xml"
    xml.write_text(xml.read_text()[:60])   # ends in line 3 "<size><width>64</wid": the tag opened at column 16
    with pytest.raises(UserError) as exc:
        _parse_voc(root)
    assert str(exc.value) == (f"{xml}: not valid XML at line 3 column 16 (unclosed token): the file is cut short or "
                              f"damaged; restore or regenerate it")
