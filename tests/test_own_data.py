"""The "Train on your own data" page (docs/own-data.md) as a user runs it: every command block, in a fresh
directory, with the epochs and image counts shortened; its dataset file and scan line are the real ones; and
`ppmulti data convert` between the YOLO, COCO and VOC layouts keeps every box."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO
from test_docs import commands

PAGE = REPO / "docs" / "own-data.md"

# The page's commands, in its order (the first test checks the page still shows exactly these).
YOLO = [
    "ppmulti data demo dataset/shapes --format yolo --train 64 --val 16",
    "python tools/train.py --data dataset/shapes/data.yaml --cfg yolov5n --weights '' --img 160 --epochs 30 "
    "--batch 16 --device cpu",
    "python tools/val.py --data dataset/shapes/data.yaml --weights runs/train/exp/weights/best.pdparams --img 160",
    "python tools/detect.py --weights runs/train/exp/weights/best.pdparams --source dataset/shapes/images/val "
    "--save-txt",
]
COCO = [
    "ppmulti data demo dataset/shapes-coco --format coco --train 64 --val 16",
    "python tools/train.py -c shapes_ppyoloe.yml --eval",
    "python tools/eval.py -c shapes_ppyoloe.yml --weights output/shapes_ppyoloe/weights/best.pdparams",
    "python tools/infer.py -c shapes_ppyoloe.yml --weights output/shapes_ppyoloe --infer_dir "
    "dataset/shapes-coco/images/val",
]
VOC = [
    "ppmulti data demo dataset/shapes-voc --format voc --train 64 --val 16",
    "ppmulti data convert dataset/shapes-voc dataset/shapes-voc --to yolo",
    "python tools/train.py --data dataset/shapes-voc/data.yaml --cfg yolov5n --weights '' --img 160 --epochs 30 "
    "--batch 16 --device cpu",
    "python tools/val.py --data dataset/shapes-voc/data.yaml --weights runs/train/exp/weights/best.pdparams --img 160",
]
COCO_ITSELF = ["ppmulti launch --gpus 0,1,2,3,4,5,6,7 tools/train.py -c configs/ppyoloe/ppyoloe_crn_s_300e_coco.yml "
               "--batch 64 --eval"]   # a dry run in test_docs (no COCO download in tests)

# Shorter runs of the same commands: flags they already take.
SHORTER = {"--epochs 30": "--epochs 1", "--train 64 --val 16": "--train 16 --val 4", "--img 160": "--img 64",
           "-c shapes_ppyoloe.yml --eval": "-c shapes_ppyoloe.yml --eval --epochs 1 -o snapshot_epoch=1"}


def _yaml_blocks(text: str) -> list[str]:
    return re.findall(r"^```yaml\n(.*?)^```", text, re.M | re.S)


def test_the_page_shows_these_commands():
    assert commands(PAGE.read_text()) == [*YOLO, *COCO, *VOC, *COCO_ITSELF]


def test_the_config_on_the_page_names_the_datasets_parts(tmp_path):
    """The page's COCO config: the demo config as its _BASE_, the dataset's parts under PaddleDetection's keys."""
    import yaml

    block = next(b for b in _yaml_blocks(PAGE.read_text()) if "COCODataSet" in b)
    data = yaml.safe_load(block)
    assert data["num_classes"] == 3 and data["metric"] == "COCO"
    assert data["_BASE_"] == ["configs/demo/ppyoloe_demo.yml"]
    for section in ("TrainDataset", "EvalDataset"):
        assert {"dataset_dir", "image_dir", "anno_path"} <= set(data[section])
    shipped = yaml.safe_load((REPO / "configs" / "datasets" / "demo_coco.yml").read_text())
    assert data["TrainDataset"]["data_fields"] == shipped["TrainDataset"]["data_fields"]


def test_the_scan_line_on_the_page_is_the_demo_sets(tmp_path):
    """The page's example line is what the scan prints for `ppmulti data demo ... --train 64 --val 16`."""
    from ppmulti.common.synthdata import generate
    from ppmulti.rank.data.yolo import load_data_yaml, scan

    shown = re.search(r"^(train: \d+ images, .*)$", PAGE.read_text(), re.M).group(1)
    generate(tmp_path / "shapes", fmt="yolo", n_train=64, n_val=16)
    _, report = scan(load_data_yaml(tmp_path / "shapes" / "data.yaml"), "train", use_cache=False)
    assert report.line("train") == shown


def _boxes(ds) -> dict[str, list]:
    return {split: [(s.image.name, s.width, s.height, [(c, *(round(v, 1) for v in box)) for c, *box in s.boxes])
                    for s in samples] for split, samples in ds.splits.items()}


def test_convert_between_the_three_layouts_keeps_every_box(tmp_path):
    """COCO -> YOLO -> VOC -> COCO: the same images, sizes, classes and boxes (to 0.1 px) as the demo's own COCO
    json, and the same class names; DST = SRC adds the new layout's files and copies no image."""
    from ppmulti.common import layouts
    from ppmulti.common.synthdata import generate

    generate(tmp_path / "coco", fmt="coco", n_train=8, n_val=4, size=128, seed=1)
    original = layouts.read(tmp_path / "coco")
    assert original.names == ["rectangle", "ellipse", "triangle"]
    assert sum(len(s.boxes) for s in original.splits["train"]) > 0
    layouts.convert(tmp_path / "coco", tmp_path / "yolo", "yolo")
    layouts.convert(tmp_path / "yolo", tmp_path / "voc", "voc")
    layouts.convert(tmp_path / "voc", tmp_path / "back", "coco")
    back = layouts.read(tmp_path / "back")
    assert back.names == original.names and _boxes(back) == _boxes(original)
    assert json.loads((tmp_path / "back" / "annotations" / "instances_val.json").read_text())["info"]
    images = sorted((tmp_path / "voc" / "images").rglob("*.jpg"))
    layouts.convert(tmp_path / "voc", tmp_path / "voc", "yolo")   # in place: labels and data.yaml beside
    assert sorted((tmp_path / "voc" / "images").rglob("*.jpg")) == images
    assert _boxes(layouts.read_yolo(tmp_path / "voc")) == _boxes(original)


def test_demo_voc_is_the_same_set_as_demo_coco(tmp_path):
    from ppmulti.common import layouts
    from ppmulti.common.synthdata import exists, generate

    generate(tmp_path / "coco", fmt="coco", n_train=6, n_val=3, size=96, seed=2)
    generate(tmp_path / "voc", fmt="voc", n_train=6, n_val=3, size=96, seed=2)
    assert exists(tmp_path / "voc", "voc") and not exists(tmp_path / "voc", "coco")
    assert (tmp_path / "voc" / "label_list.txt").read_text() == "rectangle\nellipse\ntriangle\n"
    assert _boxes(layouts.read(tmp_path / "voc")) == _boxes(layouts.read(tmp_path / "coco"))


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ppmulti.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)})


@pytest.mark.parametrize("args, message", [
    (["data", "convert", "nowhere", "out", "--to", "coco"], "nowhere: no such dataset directory"),
    (["data", "convert", ".", "out", "--to", "coco"], "no data.yaml (YOLO), label_list.txt (VOC) or "),
])
def test_convert_refuses_in_one_line(tmp_path, args, message):
    proc = _cli(*args, cwd=tmp_path)
    assert proc.returncode != 0 and message in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def _shell(command: str, cwd: Path) -> subprocess.CompletedProcess:
    for long, short in SHORTER.items():
        command = command.replace(long, short)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
           "PYTHONPATH": str(REPO)}
    return subprocess.run(["bash", "-c", command], cwd=cwd, env=env, capture_output=True, text=True, timeout=900)


def _fresh(tmp_path: Path, name: str) -> Path:
    """A directory that looks like a checkout to the commands (tools/, configs/) and holds nothing else."""
    cwd = tmp_path / name
    cwd.mkdir()
    for part in ("tools", "configs"):
        (cwd / part).symlink_to(REPO / part)
    return cwd


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["yolo", "coco", "voc"])
def test_the_pages_commands_train_validate_and_predict(layout, tmp_path):
    """Each layout's block as typed (epochs 1, 16 + 4 images, 64 px), one after the other in a fresh directory."""
    cwd = _fresh(tmp_path, layout)
    if layout == "coco":   # the page's config, saved as the page says
        block = next(b for b in _yaml_blocks(PAGE.read_text()) if "COCODataSet" in b)
        (cwd / "shapes_ppyoloe.yml").write_text(block)
    outputs = []
    for command in {"yolo": YOLO, "coco": COCO, "voc": VOC}[layout]:
        proc = _shell(command, cwd)
        assert proc.returncode == 0, f"{command}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        outputs.append(proc.stdout + proc.stderr)
    if layout in ("yolo", "voc"):
        run = cwd / "runs" / "train" / "exp"
        log = (run / "train.log").read_text()
        assert re.search(r"train: 16 images, \d+ boxes, \d+ background, 0 corrupt skipped", log), log[-2000:]
        assert "nc=3" in (run / "config.yml").read_text().replace("num_classes: 3", "nc=3")
        assert (run / "hyp.yaml").is_file() and (run / "opt.yaml").is_file()   # both, with or without --hyp
        assert (cwd / "runs" / "val" / "exp").is_dir()
        if layout == "yolo":
            assert (cwd / "runs" / "detect" / "exp").is_dir()
            assert len(list((cwd / "runs" / "detect" / "exp").glob("*.jpg"))) == 4
    else:
        run = cwd / "output" / "shapes_ppyoloe"
        assert (run / "weights" / "best.pdparams").is_file()
        assert "num_classes: 3" in (run / "config.yml").read_text()
        assert re.search(r"mAP", outputs[2]), outputs[2][-2000:]
        assert len(list((cwd / "output").rglob("*.jpg")) + list((cwd / "output").rglob("*.png"))) >= 4
