"""The reference batch of a config (ref_batch.resolve): -o, the config's own, PaddleDetection's docs, or none."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from ppmulti.common.errors import UserError
from ppmulti.rank import ref_batch
from ppmulti.rank.engine.lr import scale_lr

# a PaddleDetection release/2.6 checkout to hold the table against (CI has none: it cannot reach the repository);
# the table's lookups and the start line are tested without it below
CHECKOUT = Path(os.environ.get("PPMULTI_PADDLEDETECTION") or "PaddleDetection-checkout-not-given")


@pytest.mark.parametrize("family,name,gpus,source", [
    ("ppyoloe", "ppyoloe_plus_crn_s_80e_coco", 8, "configs/ppyoloe/README.md"),
    ("picodet", "picodet_s_320_coco_lcnet", 4, "configs/picodet/README_en.md"),
    ("yolox", "yolox_nano_300e_coco", 8, "configs/yolox/README.md"),
    ("yolov3", "yolov3_mobilenet_v1_270e_coco", 8, "configs/yolov3/README.md"),
    ("yolov3", "yolov3_mobilenet_v1_roadsign", 1, "docs/tutorials/QUICK_STARTED.md"),
    ("ppyolo", "ppyolo_r18vd_coco", 4, "configs/ppyolo/README.md"),
    ("ppyolo", "ppyolo_mbv3_large_coco", 4, "configs/ppyolo/README.md"),
    ("ppyolo", "ppyolo_r50vd_dcn_1x_coco", 8, "configs/ppyolo/README.md"),
    ("ppyolo", "ppyolov2_r50vd_dcn_365e_coco", 8, "configs/ppyolo/README.md"),
    ("ssd", "ssd_vgg16_300_240e_voc", 4, "configs/ssd/README.md"),
    ("ssd", "ssd_mobilenet_v1_300_120e_voc", 2, "configs/ssd/README.md"),
    ("ssd", "ssdlite_mobilenet_v1_300_coco", 8, "docs/tutorials/GETTING_STARTED_cn.md"),
    ("retinanet", "retinanet_r101_fpn_2x_coco", 4, "configs/retinanet/README.md"),
    ("retinanet", "retinanet_r50_fpn_1x_coco", 8, "configs/retinanet/README.md"),
    ("dino", "dino_r50_4scale_1x_coco", 4, "configs/dino/README.md"),
    ("faster_rcnn", "faster_rcnn_r50_fpn_1x_coco", 8, "docs/tutorials/GETTING_STARTED_cn.md"),
])
def test_lookup_by_family_and_file_name(family, name, gpus, source):
    entry = ref_batch.lookup(family, name)
    assert (entry.gpus, entry.source) == (gpus, source)


def test_no_entry_outside_the_table():
    assert ref_batch.lookup("keypoint", "higherhrnet_hrnet_w32_512") is None


def _write(path: Path, data: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.fixture
def tree(tmp_path) -> Path:
    """A PaddleDetection-form configs/ tree: a PP-YOLOE+ config whose reader base sets 4 images per GPU."""
    _write(tmp_path / "configs" / "ppyoloe" / "_base_" / "reader.yml", {"TrainReader": {"batch_size": 4}})
    _write(tmp_path / "configs" / "ppyoloe" / "ppyoloe_plus_crn_s_80e_coco.yml",
           {"_BASE_": ["_base_/reader.yml"], "LearningRate": {"base_lr": 0.01}})
    return tmp_path


def test_paddledetection_config_gets_its_docs_batch(tree):
    ref = ref_batch.resolve(None, tree / "configs/ppyoloe/ppyoloe_plus_crn_s_80e_coco.yml", [])
    assert ref.ref_batch == 32
    assert ref.source == "PaddleDetection's 8 GPUs x 4 per GPU, configs/ppyoloe/README.md"


def test_the_per_gpu_batch_is_the_files_not_the_override(tree):
    # -o TrainReader.batch_size=2 changes what trains, not what base_lr was tuned for
    ref = ref_batch.resolve(None, tree / "configs/ppyoloe/ppyoloe_plus_crn_s_80e_coco.yml",
                            ["TrainReader.batch_size=2"])
    assert ref.ref_batch == 32


def test_a_users_config_built_on_a_paddledetection_one_gets_its_family(tree, tmp_path):
    mine = _write(tmp_path / "work" / "mine.yml",
                  {"_BASE_": [str(tree / "configs/ppyoloe/ppyoloe_plus_crn_s_80e_coco.yml")], "epoch": 3})
    assert ref_batch.resolve(None, mine, []).ref_batch == 32


def test_override_and_the_configs_own_win(tree):
    config = tree / "configs/ppyoloe/ppyoloe_plus_crn_s_80e_coco.yml"
    assert ref_batch.resolve(16, config, ["ref_batch=16"]) == ref_batch.Reference(16, "-o ref_batch=16")
    assert ref_batch.resolve(64, config, []) == ref_batch.Reference(64, "")


@pytest.mark.parametrize("bad", ["0", "-8", "abc", "12.5"])
def test_a_bad_ref_batch_is_refused(tree, bad):
    with pytest.raises(UserError, match="ref_batch .*a positive integer"):
        ref_batch.resolve(None, tree / "configs/ppyoloe/ppyoloe_plus_crn_s_80e_coco.yml", [f"ref_batch={bad}"])


def test_no_reference_anywhere_says_so(tmp_path):
    config = _write(tmp_path / "mine" / "x.yml", {"TrainReader": {"batch_size": 8}})
    ref = ref_batch.resolve(None, config, [])
    assert ref.ref_batch is None and ref.source.startswith("no ref_batch in the config: base_lr as given")


def test_the_start_line_names_the_reference():
    plan = scale_lr(0.01, 32, 8, dataset_size=3200, warmup_steps=100)
    from dataclasses import replace

    line = replace(plan, ref_source="PaddleDetection's 8 GPUs x 4 per GPU, configs/ppyoloe/README.md").describe()
    assert line == ("lr 0.0025 = base_lr 0.01 x effective batch 8 / ref_batch 32 (PaddleDetection's 8 GPUs x 4 per "
                    "GPU, configs/ppyoloe/README.md); warmup 400 optimizer steps (config: 100 steps at batch 32)")


# ----------------------------------------------------------------------------- against PaddleDetection's checkout
needs_checkout = pytest.mark.skipif(not (CHECKOUT / "configs" / "ppyoloe").is_dir(),
                                    reason="checks the table against PaddleDetection's own docs: set "
                                           "PPMULTI_PADDLEDETECTION=/path/to/a/release-2.6/checkout")


@needs_checkout
@pytest.mark.parametrize("entry", ref_batch.DOCS, ids=lambda e: f"{e.family}:{e.prefix or '*'}")
def test_every_phrase_is_in_its_source(entry):
    assert entry.phrase in (CHECKOUT / entry.source).read_text(encoding="utf-8")


@needs_checkout
@pytest.mark.parametrize("config,ref", [
    ("configs/ppyoloe/ppyoloe_plus_crn_s_80e_coco.yml", 64),     # README: 8 GPUs; 8 per GPU in its reader
    ("configs/picodet/picodet_s_320_coco_lcnet.yml", 256),      # README_en: 4 GPUs; 64 per GPU
    ("configs/yolox/yolox_nano_300e_coco.yml", 64),             # README: 8 GPUs x 8 = 64
    ("configs/yolov3/yolov3_mobilenet_v1_270e_coco.yml", 64),   # README: 8 GPUs, total 64
    ("configs/ppyolo/ppyolo_r18vd_coco.yml", 128),              # README table: 4 GPUs x 32
    ("configs/ppyolo/ppyolo_r50vd_dcn_1x_coco.yml", 192),       # README: 8 GPUs x 24
    ("configs/ssd/ssd_vgg16_300_240e_voc.yml", 32),             # README: 4 GPUs, total 32
    ("configs/ssd/ssd_mobilenet_v1_300_120e_voc.yml", 64),      # README: 2 GPUs, total 64
    ("configs/yolof/yolof_r50_c5_1x_coco.yml", 32),             # README: 8 GPUs, total 32
    ("configs/faster_rcnn/faster_rcnn_r50_fpn_1x_coco.yml", 8),  # MODEL_ZOO_en: 1x at total batch 8, lr 0.01
])
def test_paddledetections_own_configs(config, ref):
    assert ref_batch.resolve(None, CHECKOUT / config, []).ref_batch == ref
