"""The data set and the config agree on the classes at start (data.agree): refused in one line, or num_classes
taken from the data when a _BASE_ dataset file set it; what ppdet really does with category ids."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from conftest import REPO, demo_overrides, one_line_error, run_tool
from ppmulti.common.errors import UserError
from ppmulti.rank.data import agree

DEMO_CONFIG = REPO / "configs" / "demo" / "ppyoloe_demo.yml"


def _coco(path: Path, cat_ids, ann_cats, names=None) -> Path:
    names = names or [f"c{i}" for i in cat_ids]
    data = {"info": {}, "licenses": [],
            "images": [{"id": 1, "file_name": "a.png", "width": 64, "height": 64}],
            "annotations": [{"id": i + 1, "image_id": 1, "category_id": c, "bbox": [4, 4, 20, 20], "area": 400,
                             "iscrowd": 0} for i, c in enumerate(ann_cats)],
            "categories": [{"id": c, "name": n} for c, n in zip(cat_ids, names)]}
    path.write_text(json.dumps(data))
    return path


def _yml(path: Path, data: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data))
    return path


# ----------------------------------------------------------------------------- the data's classes
def test_categories_keep_the_list_order_whatever_the_ids():
    got = agree.coco_classes({"categories": [{"id": 30, "name": "a"}, {"id": 7, "name": "b"},
                                             {"id": 12, "name": "c"}]}, "x.json")
    assert got.ids == (30, 7, 12) and got.names == ("a", "b", "c") and got.count == 3


@pytest.mark.parametrize("cats,needle", [(None, "'categories' is missing"), ([], "'categories' is empty"),
                                         ([{"id": 1, "name": "a"}, {"id": 1, "name": "b"}],
                                          "category id 1 is listed twice")])
def test_bad_category_lists_are_named(cats, needle):
    data = {} if cats is None else {"categories": cats}
    with pytest.raises(UserError, match=needle):
        agree.coco_classes(data, "the training set's x.json")


def test_an_annotation_of_an_unlisted_category_is_named(tmp_path):
    path = _coco(tmp_path / "a.json", [1, 2], [1, 5])
    data = json.loads(path.read_text())
    err = agree.unknown_category(data, agree.coco_classes(data, str(path)))
    assert "1 annotation(s)" in str(err) and "annotation 2 (image 1) with category_id 5" in str(err)
    assert "ids [1, 2]" in str(err)


def test_section_classes_reads_a_coco_json_and_a_yolo_yaml(tmp_path, small_demo):
    cfg = {"EvalDataset": {"name": "COCODataSet", "dataset_dir": str(small_demo), "image_dir": "images/val",
                           "anno_path": "annotations/instances_val.json"},
           "TrainDataset": {"name": "YOLODataSet", "data": str(small_demo / "data.yaml"), "split": "train"}}
    assert agree.section_classes(cfg, "EvalDataset").names == ("rectangle", "ellipse", "triangle")
    assert agree.section_classes(cfg, "TrainDataset").count == 3
    cfg["TrainDataset"]["single_cls"] = True
    assert agree.section_classes(cfg, "TrainDataset").names == ("object",)
    cfg["EvalDataset"]["anno_path"] = "missing.json"   # check_dataset names a missing file, not this check
    assert agree.section_classes(cfg, "EvalDataset") is None


# ----------------------------------------------------------------------------- where num_classes came from
def test_origin_of_num_classes(tmp_path):
    ds = _yml(tmp_path / "configs" / "datasets" / "coco_detection.yml",
              {"num_classes": 80, "TrainDataset": {"name": "COCODataSet"}})
    model = _yml(tmp_path / "configs" / "m" / "_base_" / "model.yml", {"num_classes": 5, "depth_mult": 1.0})
    top = _yml(tmp_path / "configs" / "m" / "top.yml", {"_BASE_": ["../datasets/coco_detection.yml"], "epoch": 1})
    origin = agree.num_classes_origin(top)
    assert origin.adoptable and origin.where == f"{ds} (a _BASE_ file)"
    assert agree.num_classes_origin(top, ["num_classes=80"]) == agree.Origin("-o num_classes=80")
    assert agree.num_classes_origin(top, [], edited_by="--data/--cfg") == agree.Origin("--data/--cfg")
    # a later base wins the merge; a model file is not a dataset file
    both = _yml(tmp_path / "configs" / "m" / "both.yml", {"_BASE_": ["../datasets/coco_detection.yml",
                                                                     "_base_/model.yml"]})
    assert agree.num_classes_origin(both) == agree.Origin(f"{model} (a _BASE_ file)", adoptable=False)
    own = _yml(tmp_path / "configs" / "m" / "own.yml", {"_BASE_": ["../datasets/coco_detection.yml"],
                                                        "num_classes": 80})
    assert agree.num_classes_origin(own) == agree.Origin(str(own))


# ----------------------------------------------------------------------------- the checks
THREE = agree.DataClasses("the training set's t.json", (1, 2, 3), ("a", "b", "c"))


def test_agreeing_data_changes_nothing():
    cfg = {"num_classes": 3}
    assert agree.agree_train(cfg, THREE, agree.Origin("c.yml"), "c.yml", top_label=2) == [] and cfg["num_classes"] == 3


def test_num_classes_from_a_base_dataset_file_is_taken_from_the_data():
    cfg = {"num_classes": 80}
    notes = agree.agree_train(cfg, THREE, agree.Origin("coco_detection.yml (a _BASE_ file)", True), "c.yml")
    assert cfg["num_classes"] == 3
    assert notes == ["num_classes 80 comes from coco_detection.yml (a _BASE_ file) but the training set's t.json "
                     "has 3 categories (a, b, c): training with num_classes=3, taken from the data; "
                     "-o num_classes=N or num_classes in c.yml sets it"]


@pytest.mark.parametrize("num", [80, 2])
def test_num_classes_the_user_set_is_refused_with_the_fix(num):
    with pytest.raises(UserError) as err:
        agree.agree_train({"num_classes": num}, THREE, agree.Origin(f"-o num_classes={num}"), "c.yml")
    assert str(err.value) == (f"num_classes {num} (from -o num_classes={num}) does not match the 3 categories of "
                              f"the training set's t.json (a, b, c); give -o num_classes=3 (or set num_classes: 3 "
                              f"in c.yml)")


def test_a_label_past_num_classes_is_refused():
    with pytest.raises(UserError, match=r"has class id 3 but num_classes is 3 .*ids 0..2.*-o num_classes=4"):
        agree.agree_train({"num_classes": 3}, None, agree.Origin("c.yml"), "c.yml", top_label=3)


def test_validation_categories_must_be_the_training_ones(tmp_path):
    cfg = {"num_classes": 3, "EvalDataset": {"name": "COCODataSet", "dataset_dir": str(tmp_path),
                                             "anno_path": "v.json"}}
    _coco(tmp_path / "v.json", [1, 3, 2], [1])
    with pytest.raises(UserError, match=r"lists the categories \[1, 3, 2\].*class k must be the same category"):
        agree.agree_eval(cfg, THREE, "c.yml")
    _coco(tmp_path / "v.json", [1, 2, 3, 4], [1])
    with pytest.raises(UserError, match="num_classes 3 does not match the 4 categories of the validation set's"):
        agree.agree_eval(cfg, None, "c.yml")
    _coco(tmp_path / "v.json", [1, 2, 3], [1, 9])
    with pytest.raises(UserError, match="category_id 9"):
        agree.agree_eval(cfg, THREE, "c.yml")
    _coco(tmp_path / "v.json", [1, 2, 3], [3])
    agree.agree_eval(cfg, THREE, "c.yml")


# ----------------------------------------------------------------------------- ppdet's own behaviour
def _ppdet_coco(tmp_path, cat_ids, ann_cats):
    from ppmulti.rank.config import ppdet_workspace

    ppdet_workspace()
    from ppdet.data.source.category import get_categories
    from ppdet.data.source.coco import COCODataSet

    (tmp_path / "a.png").write_bytes(b"")   # ppdet only checks that the file exists
    _coco(tmp_path / "a.json", cat_ids, ann_cats)
    ds = COCODataSet(dataset_dir=str(tmp_path), image_dir="", anno_path="a.json",
                     data_fields=["image", "gt_bbox", "gt_class", "is_crowd"])
    return ds, get_categories


def test_ppdet_numbers_non_contiguous_unsorted_ids_the_same_way_in_training_and_evaluation(tmp_path):
    ds, get_categories = _ppdet_coco(tmp_path, [30, 7, 12], [7, 12, 30])
    ds.parse_dataset()
    assert ds.catid2clsid == {30: 0, 7: 1, 12: 2}
    assert [int(c) for c in ds.roidbs[0]["gt_class"].ravel()] == [1, 2, 0]
    # what inference and the metric map classes back with: the inverse of the training mapping
    clsid2catid, _ = get_categories("COCO", str(tmp_path / "a.json"))
    assert clsid2catid == {v: k for k, v in ds.catid2clsid.items()}
    assert agree.dataset_classes(ds, "TrainDataset").ids == (30, 7, 12)


def test_ppdet_dies_on_an_unlisted_category_and_the_check_names_it(tmp_path):
    ds, _ = _ppdet_coco(tmp_path, [1, 2], [1, 4])
    with pytest.raises(KeyError):
        ds.parse_dataset()
    cfg = {"TrainDataset": {"name": "COCODataSet", "dataset_dir": str(tmp_path), "anno_path": "a.json"}}
    assert "category_id 4" in str(agree.explain_parse_error(cfg, "TrainDataset"))


# ----------------------------------------------------------------------------- as a user runs it
@pytest.mark.slow
def test_a_num_classes_the_data_does_not_have_stops_at_start(small_demo, tmp_path):
    """The issue's case: 80 classes against a set of 3 trained an epoch, then ppdet's KeyError in evaluation."""
    proc = run_tool([str(REPO / "tools" / "train.py"), "-c", str(DEMO_CONFIG), "--eval", "--epochs", "1",
                     "--output", str(tmp_path / "run"), "-o", *demo_overrides(small_demo), "num_classes=80"],
                    cwd=tmp_path)
    one_line_error(proc, "num_classes 80 (from -o num_classes=80) does not match the 3 categories",
                   "instances_train.json (rectangle, ellipse, triangle)", "give -o num_classes=3")
    assert "epoch 1/1" not in proc.stdout + proc.stderr


@pytest.mark.slow
def test_a_base_dataset_files_80_classes_follow_the_data_and_the_lr_scales_from_paddledetections_batch(
        small_demo, tmp_path):
    """A PaddleDetection-form tree: configs/ppyoloe/<config>.yml on configs/datasets/coco_detection.yml
    (num_classes 80, dataset/coco) with a data set of 3 categories: num_classes 3 from the data, one epoch, and an
    evaluation that scores every class (score threshold 0: with 80 classes it was ppdet's KeyError). The lr scales
    from PaddleDetection's 8 GPUs x the config's 4 per GPU."""
    _yml(tmp_path / "configs" / "datasets" / "coco_detection.yml", {
        "metric": "COCO", "num_classes": 80,
        "TrainDataset": {"name": "COCODataSet", "dataset_dir": "dataset/coco", "image_dir": "images/train",
                         "anno_path": "annotations/instances_train.json", "allow_empty": True, "sample_num": 16,
                         "data_fields": ["image", "gt_bbox", "gt_class", "is_crowd"]},
        "EvalDataset": {"name": "COCODataSet", "dataset_dir": "dataset/coco", "image_dir": "images/val",
                        "anno_path": "annotations/instances_val.json", "allow_empty": True},
        "TestDataset": {"name": "ImageFolder", "anno_path": "annotations/instances_val.json"}})
    base = REPO / "configs"
    config = _yml(tmp_path / "configs" / "ppyoloe" / "ppyoloe_plus_crn_s_80e_coco.yml", {
        "_BASE_": ["../datasets/coco_detection.yml", str(base / "runtime.yml"),
                   str(base / "ppyoloe/_base_/ppyoloe_crn.yml"), str(base / "ppyoloe/_base_/ppyoloe_reader.yml")],
        "use_gpu": False, "norm_type": "bn", "depth_mult": 0.33, "width_mult": 0.25, "pretrain_weights": "",
        "epoch": 1, "LearningRate": {"base_lr": 0.01, "schedulers": [{"name": "CosineDecay", "max_epochs": 1},
                                                                     {"name": "LinearWarmup", "start_factor": 0.0,
                                                                      "steps": 100}]},
        "PPYOLOEHead": {"static_assigner_epoch": 0}, "TrainReader": {"batch_size": 4}})
    (tmp_path / "dataset").mkdir()
    (tmp_path / "dataset" / "coco").symlink_to(small_demo)
    over = [o for o in demo_overrides(small_demo) if not o.startswith(("TrainDataset", "EvalDataset", "TestDataset"))]
    proc = run_tool([str(REPO / "tools" / "train.py"), "-c", str(config.relative_to(tmp_path)), "--eval",
                     "--output", str(tmp_path / "run"), "-o", *over, "TrainReader.batch_size=8",
                     "PPYOLOEHead.nms.score_threshold=0.0"], cwd=tmp_path)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert ("num_classes 80 comes from configs/datasets/coco_detection.yml (a _BASE_ file) but the training set's "
            "dataset/coco/annotations/instances_train.json has 3 categories (rectangle, ellipse, triangle): training "
            "with num_classes=3, taken from the data") in out
    assert ("lr 0.0025 = base_lr 0.01 x effective batch 8 / ref_batch 32 (PaddleDetection's 8 GPUs x 4 per GPU, "
            "configs/ppyoloe/README.md)") in out
    saved = yaml.safe_load((tmp_path / "run" / "config.yml").read_text())
    assert saved["num_classes"] == 3 and saved["ref_batch"] == 32   # what a bare --resume reads
    assert "mAP50" in json.loads(proc.stdout.strip().splitlines()[-1])
