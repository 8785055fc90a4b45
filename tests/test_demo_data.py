"""The demo dataset: deterministic to the byte, valid COCO json, YOLO labels that agree with it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from pycocotools.coco import COCO

from ppmulti.data.demo import CLASS_NAMES, exists, generate
from ppmulti.errors import UserError


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and p.name != "data.yaml"}


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    root = tmp_path_factory.mktemp("d") / "demo"
    generate(root, fmt="both", n_train=24, n_val=64, size=128, seed=5)
    return root


def test_same_arguments_same_bytes(made, tmp_path):
    again = tmp_path / "again"
    generate(again, fmt="both", n_train=24, n_val=64, size=128, seed=5)
    assert _tree(made) == _tree(again)
    a, b = yaml.safe_load((made / "data.yaml").read_text()), yaml.safe_load((again / "data.yaml").read_text())
    assert a["path"] == str(made.resolve()) and b["path"] == str(again.resolve())
    assert {k: v for k, v in a.items() if k != "path"} == {k: v for k, v in b.items() if k != "path"}


def test_other_seed_other_images(made, tmp_path):
    other = tmp_path / "other"
    generate(other, fmt="coco", n_train=24, n_val=4, size=128, seed=6)
    assert (made / "images/train/000000.jpg").read_bytes() != (other / "images/train/000000.jpg").read_bytes()


@pytest.mark.parametrize("split,count", [("train", 24), ("val", 64)])
def test_coco_json_loads_and_is_valid(made, split, count):
    coco = COCO(str(made / f"annotations/instances_{split}.json"))
    assert len(coco.getImgIds()) == count
    assert sorted(coco.getCatIds()) == [1, 2, 3]
    raw = json.loads((made / f"annotations/instances_{split}.json").read_text())
    assert "info" in raw and "licenses" in raw
    for ann in coco.loadAnns(coco.getAnnIds()):
        x, y, w, h = ann["bbox"]
        assert w > 0 and h > 0 and x >= 0 and y >= 0 and x + w <= 128.01 and y + h <= 128.01
        assert ann["area"] == pytest.approx(w * h, abs=0.05)
        assert w >= 10 and h >= 10   # no object too small to learn at the demo's sizes
    for img in coco.loadImgs(coco.getImgIds()):
        assert (made / "images" / split / img["file_name"]).is_file()


def test_yolo_labels_agree_with_json(made):
    size = 128
    for split in ("train", "val"):
        coco = json.loads((made / f"annotations/instances_{split}.json").read_text())
        by_image = {img["id"]: [] for img in coco["images"]}
        for ann in coco["annotations"]:
            by_image[ann["image_id"]].append(ann)
        for img in coco["images"]:
            label = made / "labels" / split / (Path(img["file_name"]).stem + ".txt")
            rows = [ln.split() for ln in label.read_text().splitlines()]
            anns = by_image[img["id"]]
            assert len(rows) == len(anns)
            for row, ann in zip(rows, anns):
                cls, cx, cy, w, h = int(row[0]), *map(float, row[1:])
                assert 0 <= cls < len(CLASS_NAMES) and cls == ann["category_id"] - 1
                x, y, bw, bh = ann["bbox"]
                assert cx * size == pytest.approx(x + bw / 2, abs=1e-4 * size + 0.01)
                assert cy * size == pytest.approx(y + bh / 2, abs=1e-4 * size + 0.01)
                assert w * size == pytest.approx(bw, abs=1e-4 * size + 0.01)
                assert h * size == pytest.approx(bh, abs=1e-4 * size + 0.01)


def test_background_images_have_empty_labels(made):
    coco = json.loads((made / "annotations/instances_val.json").read_text())
    with_objects = {a["image_id"] for a in coco["annotations"]}
    background = [img for img in coco["images"] if img["id"] not in with_objects]
    assert background, "a 64-image split should hold some background images"
    for img in background:
        assert (made / "labels/val" / (Path(img["file_name"]).stem + ".txt")).read_text() == ""


def test_data_yaml(made):
    data = yaml.safe_load((made / "data.yaml").read_text())
    assert data["train"] == "images/train" and data["val"] == "images/val"
    assert data["nc"] == 3 and data["names"] == list(CLASS_NAMES)


def test_exists_marker(tmp_path):
    root = tmp_path / "m"
    assert not exists(root)
    generate(root, fmt="coco", n_train=2, n_val=1, size=64)
    assert exists(root, "coco") and not exists(root, "yolo") and not exists(root, "both")


@pytest.mark.parametrize("kwargs,word", [({"n_train": 0}, "--train"), ({"n_val": 0}, "--val"),
                                         ({"size": 32}, "--size"), ({"fmt": "voc"}, "--format")])
def test_bad_arguments(tmp_path, kwargs, word):
    with pytest.raises(UserError, match=word):
        generate(tmp_path / "x", **kwargs)


def test_root_is_a_file(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(UserError, match="is a file"):
        generate(f)
