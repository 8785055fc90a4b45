"""ONNX export (tools/export.py --format onnx): onnxruntime against Paddle's own predictor on the demo images."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import DEMO_CONFIG, REPO, one_line_error, run_tool

from ppmulti.rank import compat


# paddle2onnx has no wheel for Python 3.13 (setup.py's export extra installs none there; README's test command
# still passes). CI's full suites run on 3.11 (Paddle 3.3.1) and 3.10 (Paddle 2.6.2), where every test below runs.
needs_p2o = pytest.mark.skipif(sys.version_info >= (3, 13), reason="paddle2onnx publishes no Python 3.13 wheel")

SIZE = 128
# Tolerances between onnxruntime and Paddle's predictor on the same inputs, both float32 on the CPU: box
# corners within 0.01 px (the random heads below put corners up to ~500 px from the origin, where float32 steps
# by 3e-5; measured up to 1.6e-3), scores within 1e-5 (measured up to 1e-7).
BOX_ATOL = 0.01
SCORE_ATOL = 1e-5


@pytest.fixture(scope="module", params=["ppyoloe", "yolov5"])
def model(request, small_demo):
    """(name, config, overrides, weights, dataset root): the session's PP-YOLOE run (the demo config) or YOLOv5n run
    (YOLOv5's flags), both trained 4 epochs on the demo set (conftest), with the run's own config.yml. Trained, not
    freshly built: a fresh head scores every anchor of a class almost alike, and NMS then keeps boxes by tie order,
    which two runtimes need not share."""
    run = request.getfixturevalue(f"{request.param}_run").path
    return request.param, run / "config.yml", [], run / "weights" / "last.pdparams", small_demo


def _export(model, out: Path, *flags: str) -> Path:
    _, config, over, weights, _ = model
    out.mkdir(parents=True, exist_ok=True)
    proc = run_tool([str(REPO / "tools" / "export.py"), "-c", str(config), *(["-o", *over] if over else []),
                     "--weights", str(weights), "--output_dir", str(out), "--format", "onnx", *flags], cwd=out)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    # run from the output directory: the export writes its one folder there and nothing else (ppdet's Trainer
    # would add vdl_log_dir/ when the config's use_vdl is on)
    assert sorted(p.name for p in out.iterdir()) == [Path(config).stem], sorted(out.iterdir())
    onnx_file = Path(proc.stdout.strip().splitlines()[-1].split(" written to ", 1)[1])
    assert onnx_file.name == "model.onnx" and onnx_file.is_file()
    # the Paddle inference model it was converted from stays beside it
    assert (onnx_file.parent / compat.exported_program_name()).is_file()
    return onnx_file


def _demo_batches(model, batch: int) -> list[dict[str, np.ndarray]]:
    """The demo val images, preprocessed by the config's own TestReader, as feeds of ``batch`` images."""
    from ppdet.core.workspace import create

    from ppmulti.rank import config as config_mod

    _, config, over, _, root = model
    config_mod.load(config, [*over, f"TestReader.batch_size={batch}"])
    dataset = create("TestDataset")()
    dataset.set_images(sorted(str(p) for p in (root / "images" / "val").glob("*.jpg"))[:4])
    feeds = []
    for data in create("TestReader")(dataset, 0):
        feeds.append({"image": data["image"].numpy(), "scale_factor": data["scale_factor"].numpy(),
                      "im_shape": data["im_shape"].numpy()})
    assert len(feeds) == 4 // batch and feeds[0]["image"].shape == (batch, 3, SIZE, SIZE)
    return feeds


class Runtimes:
    """Paddle's predictor on the exported Paddle model and onnxruntime on model.onnx, fed the same arrays."""

    def __init__(self, onnx_file: Path):
        import onnxruntime
        import paddle.inference

        self.paddle = paddle.inference.create_predictor(compat.cpu_predictor_config(onnx_file.parent))
        self.ort = onnxruntime.InferenceSession(str(onnx_file), providers=["CPUExecutionProvider"])

    def run(self, feed: dict[str, np.ndarray]) -> tuple[list[np.ndarray], list[np.ndarray]]:
        for name in self.paddle.get_input_names():
            self.paddle.get_input_handle(name).copy_from_cpu(feed[name])
        self.paddle.run()
        ours = [self.paddle.get_output_handle(n).copy_to_cpu() for n in self.paddle.get_output_names()]
        theirs = self.ort.run(None, {i.name: feed[i.name] for i in self.ort.get_inputs()})
        return ours, theirs


@pytest.mark.seam
@pytest.mark.slow
@needs_p2o
def test_without_nms_dynamic_batch_matches_paddle(model, tmp_path):
    onnx_file = _export(model, tmp_path, "--no-nms", "--dynamic")
    rt = Runtimes(onnx_file)
    image = rt.ort.get_inputs()[0]
    assert image.name == "image" and not isinstance(image.shape[0], int), image.shape   # symbolic batch
    assert image.shape[1:] == [3, SIZE, SIZE]
    for batch in (2, 1):
        for feed in _demo_batches(model, batch):
            (p_boxes, p_scores), (o_boxes, o_scores) = rt.run(feed)
            assert p_boxes.shape == o_boxes.shape and p_boxes.shape[0] == batch and p_boxes.shape[2] == 4
            assert p_scores.shape == o_scores.shape and p_scores.shape[:2] == (batch, 3)
            np.testing.assert_allclose(o_boxes, p_boxes, rtol=0, atol=BOX_ATOL)
            np.testing.assert_allclose(o_scores, p_scores, rtol=0, atol=SCORE_ATOL)


TIE = 1e-4   # scores this close are a tie for NMS: which of two overlapping boxes survives is the runtime's pick
TIE_IOU = 0.5   # two tied boxes NMS chooses between overlap past its threshold (0.6 for YOLOv5, 0.7 for PP-YOLOE)


def _iou(a: np.ndarray, b: np.ndarray) -> float:
    w = min(a[4], b[4]) - max(a[2], b[2])
    h = min(a[5], b[5]) - max(a[3], b[3])
    inter = max(w, 0.0) * max(h, 0.0)
    return inter / ((a[4] - a[2]) * (a[5] - a[3]) + (b[4] - b[2]) * (b[5] - b[3]) - inter)


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return abs(a[1] - b[1]) <= SCORE_ATOL and np.abs(a[2:] - b[2:]).max() <= BOX_ATOL


def _match(paddle_dets: np.ndarray, onnx_dets: np.ndarray) -> int:
    """Detections (class, score, x1, y1, x2, y2) of one image from both runtimes. NMS works class by class down the
    scores, and a box's fate depends only on the boxes above it. So in each class every detection of one side pairs
    with one of the other (score within SCORE_ATOL, corners within BOX_ATOL; equal scores in any order: a random
    head gives whole rows of anchors one score) down to the highest unpaired one, and that one must be a tie: the
    other side leaves unpaired a detection whose score is within TIE and whose box overlaps it past TIE_IOU (which
    of two overlapping near-equal boxes survives is the runtime's pick, and the boxes below them may then differ:
    4 epochs leave many near-equal low scores, so ties cascade), or it sits at the score threshold (within TIE of
    the lowest score either side kept). Returns how many detections paired above the first tie."""
    floor = min(np.concatenate([paddle_dets[:, 1], onnx_dets[:, 1]]), default=0.0)
    paired = 0
    for cls in np.union1d(paddle_dets[:, 0], onnx_dets[:, 0]):
        mine, theirs = (d[d[:, 0] == cls] for d in (paddle_dets, onnx_dets))
        free, lone, scores = list(range(len(theirs))), [], []
        for row in mine[np.argsort(-mine[:, 1], kind="stable")]:
            twin = next((j for j in free if _same(theirs[j], row)), None)
            if twin is None:
                lone.append(row)
            else:
                free.remove(twin)
                scores.append(row[1])
        lone_mine, lone_theirs = np.array(lone).reshape(-1, 6), theirs[free]
        if not len(lone_mine) + len(lone_theirs):
            paired += len(scores)
            continue
        # the highest-scoring unpaired detection of either side, and the other side's unpaired ones
        top, other = max([(row, lone_theirs) for row in lone_mine] + [(row, lone_mine) for row in lone_theirs],
                         key=lambda side: side[0][1])
        tied = any(abs(r[1] - top[1]) <= TIE and _iou(r, top) > TIE_IOU for r in other)
        assert tied or top[1] - floor <= TIE, (cls, top, other, floor)
        paired += sum(score > top[1] for score in scores)
    return paired


def test_the_nms_comparison_takes_ties_and_refuses_differences():
    ref = np.array([[0, 0.9, 0, 0, 10, 10], [0, 0.5, 20, 20, 30, 30], [0, 0.30004, 40, 40, 50, 50],
                    [0, 0.2, 60, 60, 70, 70], [1, 0.01, 5, 5, 9, 9]], np.float32)
    tie = ref.copy()
    tie[2] = [0, 0.3, 41, 40, 51, 50]   # the other of two tied overlapping boxes kept
    tie[3] = [0, 0.1, 80, 80, 90, 90]   # and below it the cascade
    assert _match(ref, tie) == 3 and _match(tie, ref) == 3   # class 0 down to the tie, and class 1
    shuffled = ref[[1, 0, 4, 3, 2]]
    assert _match(ref, shuffled) == 5
    at_threshold = np.vstack([ref, [[1, 0.00998, 30, 30, 34, 34]]])   # one more box only at the score threshold
    assert _match(at_threshold, ref) == 5
    for bad in (np.vstack([ref, [[0, 0.7, 100, 100, 110, 110]]]),   # a box the other side does not have
                np.where(np.arange(5)[:, None] == 1, [0, 0.45, 20, 20, 30, 30], ref),   # another score
                np.where(np.arange(5)[:, None] == 2, [0, 0.30004, 90, 90, 99, 99], ref)):   # tied, not overlapping
        with pytest.raises(AssertionError):
            _match(ref, bad.astype(np.float32))


@pytest.mark.seam
@pytest.mark.slow
@needs_p2o
def test_with_nms_in_the_graph_matches_paddle(model, tmp_path):
    # no top-k cut: before NMS, every candidate of a class (nms_top_k); after it, every kept box (keep_top_k).
    # A cut would let score ties decide which boxes make it, and random heads make close scores.
    head = "PPYOLOEHead" if model[0] == "ppyoloe" else "YOLOv5Head"
    onnx_file = _export(model, tmp_path, "-o", f"{head}.nms.nms_top_k=4000", f"{head}.nms.keep_top_k=4000")
    rt = Runtimes(onnx_file)
    assert rt.ort.get_inputs()[0].shape == [1, 3, SIZE, SIZE]   # fixed batch by default
    assert b"NonMaxSuppression" in onnx_file.read_bytes()   # an op type, stored as plain text in the protobuf
    kept = total = 0
    for feed in _demo_batches(model, 1):
        (p_dets, p_num), (o_dets, o_num) = rt.run(feed)
        assert int(p_num[0]) == len(p_dets) and int(o_num[0]) == len(o_dets)
        kept += _match(p_dets, o_dets)
        total += len(p_dets)
    assert kept >= 0.5 * total, (kept, total)   # the ties start low: most detections pair
    two = _demo_batches(model, 2)[0]
    with pytest.raises(Exception, match="(?i)dimension|shape"):
        rt.ort.run(None, {i.name: two[i.name] for i in rt.ort.get_inputs()})


def test_nms_in_the_graph_refuses_a_dynamic_batch(repo):
    proc = run_tool(["tools/export.py", "-c", str(DEMO_CONFIG), "--format", "onnx", "--dynamic"])
    one_line_error(proc, "--dynamic", "--no-nms")


def test_missing_paddle2onnx_is_one_line(tmp_path):
    stub = tmp_path / "stub" / "paddle2onnx"
    stub.mkdir(parents=True)
    (stub / "__init__.py").write_text('raise ImportError("No module named \'paddle2onnx\'")\n')
    from conftest import REPO

    proc = run_tool(["tools/export.py", "-c", str(DEMO_CONFIG), "--format", "onnx"],
                    env={"PYTHONPATH": f"{stub.parent}:{REPO}"})
    one_line_error(proc, 'pip install -e ".[export]"')


@pytest.mark.parametrize("p2o,paddle,fits", [((1, 3, 1), (2, 6, 2), True), ((2, 1, 0), (2, 6, 2), False),
                                             ((2, 1, 0), (3, 3, 1), True), ((1, 3, 1), (3, 3, 1), False)])
def test_paddle2onnx_release_by_paddle(p2o, paddle, fits):
    assert compat.paddle2onnx_fits(p2o, paddle) is fits
    wanted = compat.paddle2onnx_wanted(paddle)
    assert compat.paddle2onnx_fits(tuple(int(x) for x in wanted.split("==")[1].split(".")), paddle)


def test_interp_scale_doubles_become_floats():
    program = {"ops": [{"#": "1.nearest_interp", "A": [
        {"AT": {"#": "0.a_array", "D": [{"#": "0.a_f64", "D": 2.0}, {"#": "0.a_f64", "D": 2.0}]}, "N": "scale"},
        {"AT": {"#": "0.a_f64", "D": 1.0}, "N": "other"}]},
        {"#": "1.full", "A": [{"AT": {"#": "0.a_f64", "D": 1.0}, "N": "value"}]}]}
    assert compat.pir_interp_scale_as_float(program) == 2
    scale, other = program["ops"][0]["A"]
    assert [e["#"] for e in scale["AT"]["D"]] == ["0.a_f32", "0.a_f32"] and other["AT"]["#"] == "0.a_f64"
    assert program["ops"][1]["A"][0]["AT"]["#"] == "0.a_f64"   # only interpolation scales change
    assert compat.pir_interp_scale_as_float(program) == 0


@pytest.mark.seam
@pytest.mark.slow
@pytest.mark.skipif(not compat.paddle3(), reason="Paddle 2.6 writes model.pdmodel, which paddle2onnx 1.3.1 reads as is")
@needs_p2o
def test_paddle3_program_needs_the_interp_scale_fix(model, tmp_path):
    """F4 shown on a real export: paddle2onnx 2.1.0 refuses Paddle 3.3.1's model.json until the fix runs."""
    import json

    import paddle2onnx

    _, config, _, weights, _ = model
    proc = run_tool(["tools/export.py", "-c", str(config), "--weights", str(weights), "--output_dir", str(tmp_path),
                     "--no-nms"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    model_dir = Path(proc.stdout.strip().splitlines()[-1].split(" written to ", 1)[1])
    program = json.loads((model_dir / "model.json").read_text())
    assert compat.pir_interp_scale_as_float(program) > 0   # the necks' upsampling carries double scales
    try:   # 2.1.0 logs "the 0th elementwise MUST be ir::FloatAttribute", then fails on an unbound name
        data = paddle2onnx.export(str(model_dir / "model.json"), str(model_dir / "model.pdiparams"),
                                  save_file=None, opset_version=11, verbose=False)
    except (Exception, SystemExit):   # noqa: BLE001 - 2.1.0 ends with sys.exit(-1) after logging the error
        data = None
    assert not data
    assert compat.paddle_to_onnx(model_dir, 11)   # with the fix


# ----------------------------------------------------------------------------- the model card an ONNX file carries
def _tiny_onnx(props: dict[str, str] | None = None) -> bytes:
    """image [1, 3, 4, 4] -> Identity: a valid ONNX model, with ``props`` as its metadata."""
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Identity", ["image"], ["out"])], "tiny",
                              [helper.make_tensor_value_info("image", TensorProto.FLOAT, [1, 3, 4, 4])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, 3, 4, 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)])
    for key, value in (props or {}).items():
        model.metadata_props.add(key=key, value=value)
    onnx.checker.check_model(model)
    return model.SerializeToString()


CARD_CONFIG = {"architecture": "UltraYOLO", "num_classes": 2, "UltraYOLO": {"model": "yolo11n.yaml"},
               "TestReader": {"sample_transforms": [{"Decode": {}}, {"Resize": {"target_size": [64, 64]}}]},
               "TrainDataset": {"name": "YOLODataSet", "data": "/home/me/data.yaml"},
               "EvalDataset": {"name": "YOLODataSet", "data": "/home/me/data.yaml"},
               "TestDataset": {"name": "ImageFolder", "anno_path": "/tmp/names.json"}}


def test_the_model_card_rides_in_the_file_without_the_data_sets(tmp_path):
    pytest.importorskip("onnx")
    from ppmulti.rank.engine.onnx_export import META_CONFIG, card_config, model_card, read_metadata, with_metadata

    card = model_card(CARD_CONFIG, ["cat", "dog"])
    data = with_metadata(_tiny_onnx({"author": "me", META_CONFIG: "old"}), card)
    (tmp_path / "m.onnx").write_bytes(data)
    meta = read_metadata(tmp_path / "m.onnx")
    assert meta["author"] == "me" and meta[META_CONFIG] != "old"   # other keys kept, its own replaced
    config, names = card_config(meta)
    assert names == ["cat", "dog"]
    assert config == {k: v for k, v in CARD_CONFIG.items() if not k.endswith("Dataset")}   # no machine's paths


@pytest.mark.parametrize("meta", [
    {},                                                        # not exported by ppmulti (or before it kept a card)
    {"ppmulti_config": "a: [1", "names": "[]"},                # YAML cut short
    {"ppmulti_config": "architecture: UltraYOLO", "names": "{"},   # names cut short
    {"ppmulti_config": "- a list", "names": "[]"},              # not a mapping
    {"ppmulti_config": "architecture: UltraYOLO", "names": '{"0": "a"}'},   # names not a list
])
def test_what_is_not_a_model_card_reads_as_none(meta):
    from ppmulti.rank.engine.onnx_export import card_config

    assert card_config(meta) is None


def test_a_file_that_is_not_onnx_has_no_metadata(tmp_path):
    from ppmulti.rank.engine.onnx_export import read_metadata

    (tmp_path / "x.onnx").write_bytes(b"not a protobuf at all \xff\xfe")
    assert read_metadata(tmp_path / "x.onnx") == {}


def test_predict_on_onnx_reads_its_card_before_the_run_s_config(tmp_path):
    """tools/detect.py --weights X.onnx: -c, else the file's card (the config as a temp file, its TestDataset the
    stored names), else RUN/config.yml, else one line saying what to pass."""
    pytest.importorskip("onnx")
    import argparse
    import json

    import yaml

    from ppmulti.common.errors import UserError
    from ppmulti.rank.engine.onnx_export import model_card
    from ppmulti.rank.eval_setup import resolve_onnx_model

    run = tmp_path / "run"
    (run / "weights").mkdir(parents=True)
    (run / "config.yml").write_text("architecture: YOLOv5\n")
    carded, bare = run / "weights" / "best.onnx", tmp_path / "moved.onnx"
    carded.write_bytes(_tiny_onnx(model_card(CARD_CONFIG, ["cat", "dog"])))
    bare.write_bytes(_tiny_onnx())

    def resolve(weights: Path, config: str | None = None) -> tuple[str, str]:
        return resolve_onnx_model(argparse.Namespace(weights=str(weights), config=config))

    assert resolve(carded, "given.yml") == ("given.yml", "")
    config, note = resolve(carded)
    assert note == "model: the config best.onnx was exported with, run by onnxruntime"
    written = yaml.safe_load(Path(config).read_text())
    assert written["architecture"] == "UltraYOLO" and written["TestDataset"]["name"] == "ImageFolder"
    cats = json.loads(Path(written["TestDataset"]["anno_path"]).read_text())["categories"]
    assert [c["name"] for c in cats] == ["cat", "dog"]
    assert resolve(carded)[0] == config   # named by its content: written once
    (run / "weights" / "old.onnx").write_bytes(_tiny_onnx())   # exported before files kept a card
    assert resolve(run / "weights" / "old.onnx")[0] == str(run / "config.yml")
    with pytest.raises(UserError, match="no config in the file .* and no config.yml in its run directory"):
        resolve(bare)
