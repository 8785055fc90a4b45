"""YOLOv5's val, detect and export command lines: their flags mapped, detect's sources and NMS, and the chain on a
trained run (val and detect on its best weights, export ONNX, detect from the ONNX file: the same boxes)."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import REPO, one_line_error, run_tool, tool_module

from ppmulti.common.errors import UserError
from ppmulti.rank.engine import detect, labels, sources


# ----------------------------------------------------------------------------- flag mapping (golden)
def test_detect_flags_as_yolov5_spells_them():
    args = tool_module("detect").parse(
        ["--weights", "w.pdparams", "--source", "imgs", "--img", "320", "--conf-thres", "0.4", "--iou-thres", "0.5",
         "--max-det", "50", "--classes", "0", "2", "--agnostic-nms", "--save-txt", "--save-conf", "--nosave",
         "--line-thickness", "1", "--hide-labels", "--hide-conf", "--project", "p", "--name", "n", "--exist-ok",
         "--device", "cpu", "--save-crop", "--save-csv", "--vid-stride", "3"])
    got = {k: getattr(args, k) for k in ("weights", "source", "imgsz", "conf_thres", "iou_thres", "max_det",
                                         "classes", "agnostic_nms", "save_txt", "save_conf", "nosave",
                                         "line_thickness", "hide_labels", "hide_conf", "project", "name", "exist_ok",
                                         "use_gpu", "save_crop", "save_csv", "vid_stride")}
    assert got == {"weights": "w.pdparams", "source": "imgs", "imgsz": 320, "conf_thres": 0.4, "iou_thres": 0.5,
                   "max_det": 50, "classes": [0, 2], "agnostic_nms": True, "save_txt": True, "save_conf": True,
                   "nosave": True, "line_thickness": 1, "hide_labels": True, "hide_conf": True, "project": "p",
                   "name": "n", "exist_ok": True, "use_gpu": False, "save_crop": True, "save_csv": True,
                   "vid_stride": 3}
    defaults = tool_module("detect").parse(["--weights", "w.onnx"])   # YOLOv5 detect.py's defaults
    assert (defaults.source, defaults.imgsz, defaults.conf_thres, defaults.iou_thres, defaults.max_det,
            defaults.project, defaults.name, defaults.line_thickness, defaults.vid_stride, defaults.save_crop,
            defaults.save_csv) == ("data/images", None, 0.25, 0.45, 1000, "runs/detect", "exp", 3, 1, False, False)
    assert tool_module("detect").parse(["--weights", "w", "--imgsz", "64", "64"]).imgsz == 64


@pytest.mark.parametrize("argv, message", [
    (["--source", "x.jpg"], "no weights given"),
    (["--weights", "w", "--view-img"], "--view-img is a YOLOv5 detect.py flag that ppmulti does not support"),
    (["--weights", "w", "--half"], "--half is a YOLOv5 detect.py flag"),
    (["--weights", "w", "--vid-stride", "0"], "--vid-stride 0: use a value of at least 1"),
    (["--weights", "w", "--imgsz", "640", "480"], "square inputs only"),
    (["--weights", "w", "--conf-thres", "2"], "--conf-thres 2.0: use a value in [0, 1]"),
    (["--weights", "w", "--classes", "-1"], "class indices start at 0"),
    (["--weights", "w", "--device", "0,1"], "one GPU"),
    (["--weights", "w", "--bogus"], "unknown argument '--bogus'"),
])
def test_bad_detect_flags_are_refused_by_name(argv, message):
    with pytest.raises(UserError, match=message.replace("[", r"\[").replace("]", r"\]")):
        tool_module("detect").parse(argv)


def test_export_flags_as_yolov5_spells_them():
    export = tool_module("export")
    args = export.parse(["--weights", "r/weights/best.pdparams", "--img", "64", "--include", "onnx", "paddle",
                         "--dynamic", "--opset", "12", "--batch", "4", "--device", "cpu"])
    assert (args.yolov5, args.formats, args.imgsz, args.dynamic, args.opset, args.batch, args.nms, args.use_gpu) == \
        (True, ["onnx", "paddle"], 64, True, 12, 4, False, False)   # YOLOv5's ONNX: raw outputs, NMS in detect
    assert export.parse(["--weights", "w.pdparams", "--include", "onnx", "--nms"]).nms is True
    assert export.beside_weights(Path("r/weights/best.pdparams"), "onnx") == Path("r/weights/best.onnx")
    assert export.beside_weights(Path("r/weights/last.pdparams"), "paddle") == Path("r/weights/last_paddle_model")
    # ppdet's command lines keep their meaning: -c, --format (or one --include), NMS in the graph, --output_dir
    ppdet = export.parse(["-c", "x.yml", "--include", "onnx"])
    assert (ppdet.yolov5, ppdet.formats, ppdet.nms, ppdet.output_dir) == (False, ["onnx"], True, "output_inference")
    assert export.parse(["-c", "x.yml", "--format", "onnx", "--no-nms"]).nms is False
    assert export.parse(["-c", "x.yml"]).formats == ["paddle"]


@pytest.mark.parametrize("argv, message", [
    (["--weights", "w", "--include", "torchscript"], "--include torchscript: a YOLOv5 format ppmulti does not write"),
    (["--weights", "w", "--include", "pdf"], "--include pdf: unknown format; use onnx or paddle"),
    (["--weights", "w", "--format", "onnx"], "--format goes with -c CONFIG"),
    (["--weights", "w.onnx", "--include", "onnx"], "already exported"),
    (["--include", "onnx"], "no weights given"),
    (["-c", "x.yml", "--include", "onnx", "paddle"], "one format per export"),
])
def test_bad_export_flags_are_refused_by_name(argv, message):
    with pytest.raises(UserError, match=message):
        tool_module("export").parse(argv)


@pytest.mark.parametrize("tool", ["eval", "val"])
def test_val_flags_as_yolov5_spells_them(tool):
    parse = tool_module(tool).parse
    args = parse(["--data", "d.yaml", "--weights", "w.pdparams", "--batch", "16", "--img", "320", "--task", "val",
                  "--conf-thres", "0.01", "--iou-thres", "0.7", "--max-det", "100", "--single-cls", "--device", "cpu",
                  "--project", "p", "--name", "n", "--exist-ok", "--save-txt", "--save-conf", "--save-json"])
    got = {k: getattr(args, k) for k in ("batch", "imgsz", "conf_thres", "iou_thres", "max_det", "single_cls",
                                         "use_gpu", "project", "name", "exist_ok", "save_txt", "save_conf",
                                         "save_json", "save_dir_wanted")}
    assert got == {"batch": 16, "imgsz": 320, "conf_thres": 0.01, "iou_thres": 0.7, "max_det": 100,
                   "single_cls": True, "use_gpu": False, "project": "p", "name": "n", "exist_ok": True,
                   "save_txt": True, "save_conf": True, "save_json": True, "save_dir_wanted": True}
    assert parse(["--weights", "w", "--batch-size", "3"]).batch == 3
    assert parse(["-c", "x.yml", "--save-json", "m.json"]).save_json == "m.json"   # ppdet's spelling: a file
    assert parse(["-c", "x.yml"]).save_dir_wanted is False   # -c command lines write no results directory
    assert parse(["--weights", "w"]).save_dir_wanted is True   # a YOLOv5 command line does (runs/val/exp*)
    with pytest.raises(UserError, match="--task test: YOLOv5 val.py's task for the test split"):
        parse(["--weights", "w", "--task", "test"])
    with pytest.raises(UserError, match="--save-txt and a bare --save-json write into the results directory"):
        parse(["-c", "x.yml", "--save-txt"])
    assert tool_module(tool).build_parser().prog == f"tools/{tool}.py"


# ----------------------------------------------------------------------------- sources
def test_sources_a_file_a_folder_a_glob_and_a_list(tmp_path, monkeypatch):
    for name in ("b.jpg", "a.png", "c.JPEG", "notes.md"):
        (tmp_path / name).write_bytes(b"x")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "d.bmp").write_bytes(b"x")

    def images(text):
        return sources.resolve_source(text).images

    assert images(str(tmp_path / "b.jpg")) == [tmp_path / "b.jpg"]
    assert images(str(tmp_path)) == [tmp_path / n for n in ("a.png", "b.jpg", "c.JPEG")]
    assert images(str(tmp_path / "*.jpg")) == [tmp_path / "b.jpg"]
    assert images(str(tmp_path / "**" / "*.bmp")) == [tmp_path / "sub" / "d.bmp"]
    listing = tmp_path / "list.txt"
    listing.write_text(f"{tmp_path / 'a.png'}\nsub/d.bmp\n\n")   # absolute, and relative to the list's folder
    monkeypatch.chdir(REPO)
    assert images(str(listing)) == [tmp_path / "a.png", tmp_path / "sub" / "d.bmp"]


@pytest.mark.parametrize("source, message", [
    ("screen", "screen capture and .streams lists are not supported"), ("list.streams", "pass one stream URL"),
    ("https://x/y.jpg", "an image URL; download the image"),
    ("{tmp}/none", "no such file or folder"), ("{tmp}/*.md", "no images .* or videos"),
    ("{tmp}/bad.txt", "1 listed paths are not files"),
])
def test_sources_refused_by_name(tmp_path, source, message):
    for name in ("clip.mp4", "b.avi", "x.jpg", "notes.md"):
        (tmp_path / name).write_bytes(b"x")
    (tmp_path / "bad.txt").write_text("missing.jpg\n")
    with pytest.raises(UserError, match=message):
        sources.resolve_source(source.format(tmp=tmp_path))


# ----------------------------------------------------------------------------- NMS and labels (golden)
BOXES = np.array([[0, 0, 10, 10], [1, 1, 11, 11], [50, 50, 60, 60], [0, 0, 10, 10.5]], dtype=np.float32)
SCORES = np.array([[0.9, 0.8, 0.1, 0.0],     # class 0
                   [0.0, 0.0, 0.7, 0.6]],    # class 1
                  dtype=np.float32)          # [C, N]


def test_nms_on_raw_outputs_as_yolov5_detect():
    got = detect.nms_raw(BOXES, SCORES, detect.NmsOptions(conf_thres=0.25, iou_thres=0.45))
    # box 1 overlaps box 0 (same class, IoU 0.68) and goes; box 3 overlaps box 0 but is class 1: it stays
    np.testing.assert_allclose(got, [[0, 0, 10, 10, 0.9, 0], [50, 50, 60, 60, 0.7, 1], [0, 0, 10, 10.5, 0.6, 1]],
                               rtol=0, atol=1e-6)
    agnostic = detect.nms_raw(BOXES, SCORES, detect.NmsOptions(0.25, 0.45, agnostic=True))
    assert agnostic[:, 5].tolist() == [0, 1]   # box 3 goes too: NMS across classes
    assert detect.nms_raw(BOXES, SCORES, detect.NmsOptions(0.25, 0.45, classes=(1,)))[:, 4].tolist() == \
        pytest.approx([0.7, 0.6])
    assert len(detect.nms_raw(BOXES, SCORES, detect.NmsOptions(0.25, 0.45, max_det=1))) == 1
    assert len(detect.nms_raw(BOXES, SCORES, detect.NmsOptions(0.75, 0.45))) == 1   # conf threshold
    assert len(detect.nms_raw(BOXES, SCORES, detect.NmsOptions(0.25, 0.9))) == 4   # nothing overlaps that much


def test_detections_from_a_graph_with_nms_get_the_same_filters():
    dets = np.array([[0, 0.9, 0, 0, 10, 10], [1, 0.6, 0, 0, 10, 10.5], [1, 0.1, 50, 50, 60, 60]], dtype=np.float32)
    got = detect.nms_done(dets, detect.NmsOptions(0.25, 0.45))
    np.testing.assert_allclose(got, [[0, 0, 10, 10, 0.9, 0], [0, 0, 10, 10.5, 0.6, 1]], rtol=0, atol=1e-6)
    assert len(detect.nms_done(dets, detect.NmsOptions(0.25, 0.45, agnostic=True))) == 1
    assert len(detect.nms_done(np.zeros((0, 6)), detect.NmsOptions())) == 0


def test_labels_in_yolov5_format():
    dets = np.array([[-5, 10, 50, 30, 0.87654321, 2]], dtype=np.float64)
    clipped = labels.clip_boxes(dets, 100, 40)
    assert labels.label_lines(clipped, 100, 40, save_conf=False) == ["2 0.25 0.5 0.5 0.5"]
    assert labels.label_lines(clipped, 100, 40, save_conf=True) == ["2 0.25 0.5 0.5 0.5 0.876543"]


# ----------------------------------------------------------------------------- bad input, as a user sees it
def test_bad_input_is_one_line(tmp_path):
    (tmp_path / "clip.mp4").write_bytes(b"x")
    (tmp_path / "x.jpg").write_bytes(b"x")
    cases = [
        (["tools/detect.py", "--weights", str(tmp_path / "none.pdparams"), "--source", str(tmp_path / "x.jpg")],
         ["none.pdparams: file not found"]),
        (["tools/detect.py", "--weights", str(tmp_path / "none.onnx"), "--source", str(tmp_path / "x.jpg")],
         ["none.onnx: file not found"]),
        (["tools/detect.py", "--weights", "w.pdparams", "--source", str(tmp_path / "clip.mp4")],
         ["clip.mp4 cannot be opened: the file is damaged"]),
        (["tools/export.py", "--weights", "w.pdparams", "--include", "tflite"], ["--include tflite"]),
        (["tools/val.py", "--weights", str(tmp_path / "none.pdparams"), "--data", "d.yaml"],
         ["none.pdparams: file not found"]),
    ]
    for argv, needles in cases:
        one_line_error(run_tool(argv, cwd=REPO), *needles)


# ----------------------------------------------------------------------------- the chain on a trained run
needs_p2o = pytest.mark.skipif(sys.version_info >= (3, 13), reason="paddle2onnx publishes no Python 3.13 wheel")
BOX_ATOL = 2e-5   # normalised label coordinates of 128 px images, written with 6 significant digits
CONF_ATOL = 1e-5
TIE = 1e-4        # confidences this close are a tie for NMS: which box survives is the runtime's pick


def _ok(proc) -> str:
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout.strip().splitlines()[-1]


def _labels(folder: Path) -> dict[str, np.ndarray]:
    return {p.stem: labels.read_label_file(p) for p in sorted(folder.glob("*.txt"))}


def _same_boxes(a: np.ndarray, b: np.ndarray) -> int:
    """Rows (class, xc, yc, w, h, conf) of one image from two runtimes: each row of ``a`` paired with one of ``b``
    (same class, conf and box within tolerance); unpaired rows must be ties (a row of the other side's unpaired
    ones with the same class and a conf within TIE), at most 10% of all. Returns how many were paired."""
    free = list(range(len(b)))
    lone_a = []
    for row in a:
        twin = next((j for j in free if b[j, 0] == row[0] and abs(b[j, 5] - row[5]) <= CONF_ATOL
                     and np.abs(b[j, 1:5] - row[1:5]).max() <= BOX_ATOL), None)
        if twin is None:
            lone_a.append(row)
        else:
            free.remove(twin)
    lone_b = b[free]
    assert len(lone_a) + len(lone_b) <= 0.10 * (len(a) + len(b)), (lone_a, lone_b)
    for mine, theirs in ((np.array(lone_a).reshape(-1, 6), lone_b), (lone_b, np.array(lone_a).reshape(-1, 6))):
        for row in mine:
            assert any(t[0] == row[0] and abs(t[5] - row[5]) <= TIE for t in theirs), (row, theirs)
    return len(a) - len(lone_a)


@pytest.mark.slow
@needs_p2o
def test_val_detect_export_and_detect_from_onnx_as_yolov5s_ci(yolov5_run, small_demo, tmp_path):
    """YOLOv5's CI detection steps with its spellings on the session's trained YOLOv5n (a copy: export writes
    beside the weights), run from a fresh directory so that runs/val and runs/detect land there."""
    run = tmp_path / "exp"
    shutil.copytree(yolov5_run.path, run)
    best = run / "weights" / "best.pdparams"
    images = small_demo / "images" / "val"
    cwd = tmp_path / "work"
    cwd.mkdir()

    metrics = json.loads(_ok(run_tool([str(REPO / "tools/val.py"), "--imgsz", "128", "--batch", "8", "--weights",
                                       str(best), "--data", str(small_demo / "data.yaml"), "--device", "cpu",
                                       "--save-txt", "--save-conf", "--save-json"], cwd=cwd)))
    assert metrics["images"] == 16 and metrics["save_dir"] == "runs/val/exp"
    val_dir = cwd / "runs" / "val" / "exp"
    assert json.loads((val_dir / "results.json").read_text())["mAP50"] == metrics["mAP50"]
    assert len(json.loads((val_dir / "best_predictions.json").read_text())) > 0
    assert len(_labels(val_dir / "labels")) > 0

    # detect on the Paddle weights, twice: exp, then exp2 (YOLOv5's numbering)
    # 4 epochs leave confidences near 0.005 at best and many near-equal ones below 0.002, where a 1e-8 difference
    # between the runtimes reorders NMS in cascades; 0.003 keeps the distinct ones
    flags = ["--source", str(images), "--imgsz", "128", "--conf-thres", "0.003", "--save-txt", "--save-conf",
             "--device", "cpu"]
    assert _ok(run_tool([str(REPO / "tools/detect.py"), "--weights", str(best), *flags], cwd=cwd)) == \
        "Results saved to runs/detect/exp"
    paddle_dir = cwd / "runs" / "detect" / "exp"
    # --classes with a class the unfiltered run found (which classes pass 0.003 after 4 epochs depends on training)
    found = np.concatenate([rows[:, 0] for rows in _labels(paddle_dir / "labels").values()]).astype(int)
    wanted = int(np.bincount(found).argmax())
    assert _ok(run_tool([str(REPO / "tools/detect.py"), "--weights", str(best), *flags, "--nosave", "--classes",
                         str(wanted)], cwd=cwd)) == "Results saved to runs/detect/exp2"
    assert sorted(p.name for p in paddle_dir.glob("*.jpg")) == sorted(p.name for p in images.glob("*.jpg"))
    assert not list((cwd / "runs" / "detect" / "exp2").glob("*.jpg"))   # --nosave
    only_one = _labels(cwd / "runs" / "detect" / "exp2" / "labels")
    assert only_one and all(set(rows[:, 0]) == {wanted} for rows in only_one.values())   # --classes N

    # export ONNX beside the weights, as YOLOv5 does, then detect from it
    line = _ok(run_tool([str(REPO / "tools/export.py"), "--weights", str(best), "--img", "128", "--include",
                         "onnx", "--device", "cpu"], cwd=cwd))
    assert line == f"ONNX model written to {run / 'weights' / 'best.onnx'}"
    assert not [p for p in (run / "weights").iterdir() if p.name.startswith(".")]   # its temp dir is gone
    assert _ok(run_tool([str(REPO / "tools/detect.py"), "--weights", str(run / "weights" / "best.onnx"), *flags],
                        cwd=cwd)) == "Results saved to runs/detect/exp3"
    onnx_dir = cwd / "runs" / "detect" / "exp3"

    paddle_labels, onnx_labels = _labels(paddle_dir / "labels"), _labels(onnx_dir / "labels")
    assert paddle_labels.keys() == onnx_labels.keys() and paddle_labels
    paired = sum(_same_boxes(paddle_labels[k], onnx_labels[k]) for k in paddle_labels)
    assert paired >= 0.9 * sum(len(v) for v in paddle_labels.values())
    # val's labels are the same model's detections under val.py's NMS (per class, IoU 0.6): each image's most
    # confident box is one that detect found too
    val_labels = _labels(val_dir / "labels")
    for stem, rows in paddle_labels.items():
        top = val_labels[stem][0]
        assert any(r[0] == top[0] and np.abs(r[1:] - top[1:]).max() <= BOX_ATOL for r in rows), (stem, top)
