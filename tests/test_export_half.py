"""FP16 and simplified export (tools/export.py --half, --simplify): the float16 ONNX file against the float32 one in
onnxruntime on the demo images, the graph converters on a small graph of their own, and what Paddle refuses."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import REPO, run_tool, tool_module

from ppmulti.common.errors import UserError
from ppmulti.rank import compat

# Python 3.13: paddle2onnx publishes no wheel, so ONNX export is refused there (the refusal with --half is tested
# below on every Python); the float16 ONNX itself is tested on 3.10-3.12
needs_p2o = pytest.mark.skipif(sys.version_info >= (3, 13), reason="paddle2onnx publishes no Python 3.13 wheel: "
                               "ONNX export is refused on 3.13 and tested on 3.10-3.12")

# float16 against float32, both in onnxruntime's CPU provider on the same float32 inputs (128 px demo images):
# box corners (pixels of the input image) within 1 px, scores within 0.005. float16 keeps 11 significant bits, so a
# corner near 128 px steps by 0.06 px; after ~60 layers of rounding, measured on both stacks: yolov5n up to 0.12 px and
# 1.3e-5, ppyoloe up to 0.19 px and 5.4e-4 (the session's 4-epoch runs score boxes near 0.01; scores are bounded
# absolutely, as a user reads them against --conf-thres).
BOX_TOL = 1.0
SCORE_TOL = 5e-3


# ----------------------------------------------------------------------------- flags and refusals
def test_half_and_simplify_as_yolov5_spells_them():
    args = tool_module("export").parse(["--weights", "r/weights/best.pdparams", "--include", "onnx", "--half",
                                        "--simplify"])
    assert (args.half, args.simplify, args.formats, args.nms) == (True, True, ["onnx"], False)


def test_simplify_is_for_onnx_only():
    export = tool_module("export")
    with pytest.raises(UserError, match="--simplify applies to ONNX"):
        export.run(export.parse(["--weights", "w.pdparams", "--include", "paddle", "--simplify"]))


@pytest.mark.parametrize("version, cuda, says", [
    ((3, 3, 1), True, "PrecisionType.Half"),     # Paddle 3: FP16 is the GPU predictor's choice, the file stays float32
    ((3, 3, 1), False, "PrecisionType.Half"),
    ((2, 6, 2), False, "GPU build"),             # Paddle 2.6 CPU build: no float16 conversion, no float16 kernels
    ((2, 6, 2), True, None),                     # Paddle 2.6 GPU build: convert_to_mixed_precision
])
def test_where_paddle_writes_a_float16_model(version, cuda, says):
    why = compat.paddle_half_unavailable(version, cuda)
    assert why is None if says is None else says in why


def test_half_paddle_model_is_one_line_on_this_build():
    """Refused before any model is built (the weights named do not exist): this CPU build writes no float16."""
    import paddle

    if not compat.paddle3() and paddle.is_compiled_with_cuda():
        pytest.skip("a GPU build of Paddle 2.6 converts the model instead of refusing (the choice per build is held "
                    "by test_where_paddle_writes_a_float16_model)")
    export = tool_module("export")
    with pytest.raises(UserError, match=r"--half for Paddle's inference model: .* --include onnx --half"):
        export.run(export.parse(["--weights", "missing.pdparams", "--include", "paddle", "--half"]))


def test_half_onnx_without_paddle2onnx_says_what_float32_says(tmp_path):
    """Where paddle2onnx is missing (Python 3.13 has none), --half changes nothing in the refusal."""
    from conftest import DEMO_CONFIG, one_line_error

    stub = tmp_path / "stub" / "paddle2onnx"
    stub.mkdir(parents=True)
    (stub / "__init__.py").write_text('raise ImportError("No module named \'paddle2onnx\'")\n')
    env = {"PYTHONPATH": f"{stub.parent}:{REPO}"}
    lines = []
    for half in ([], ["--half"]):
        proc = run_tool(["tools/export.py", "-c", str(DEMO_CONFIG), "--format", "onnx", *half], env=env)
        one_line_error(proc, "paddle2onnx")
        lines.append([ln for ln in proc.stderr.splitlines() if ln.startswith("error:")])
    assert lines[0] == lines[1]


def test_missing_onnxslim_is_one_line(monkeypatch):
    from ppmulti.rank.engine import onnx_export

    monkeypatch.setitem(sys.modules, "onnxslim", None)   # import onnxslim raises ImportError
    with pytest.raises(UserError, match="--simplify needs onnxslim .*: pip install onnxslim"):
        onnx_export.require_onnxslim()


# ----------------------------------------------------------------------------- the float16 converter on a small graph
def _small_graph(rng) -> bytes:
    """image [1, 3, 16, 16] -> Conv 3x3 (8 channels) -> Sigmoid -> Resize x2 (roi and scales from Constant nodes,
    which must stay float32) -> ReduceMax over channels [1, 1, 32, 32]."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    weight = numpy_helper.from_array(rng.normal(0, 0.3, (8, 3, 3, 3)).astype(np.float32), "w")
    nodes = [
        helper.make_node("Conv", ["image", "w"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Sigmoid", ["c"], ["s"]),
        helper.make_node("Constant", [], ["scales"],
                         value=numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32))),
        helper.make_node("Constant", [], ["roi"], value=numpy_helper.from_array(np.zeros(0, np.float32))),
        helper.make_node("Resize", ["s", "roi", "scales"], ["r"], mode="nearest"),
        helper.make_node("ReduceMax", ["r"], ["out"], axes=[1], keepdims=1),
    ]
    inputs = [helper.make_tensor_value_info("image", TensorProto.FLOAT, [1, 3, 16, 16])]
    outputs = [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, 1, 32, 32])]
    graph = helper.make_graph(nodes, "small", inputs, outputs, [weight])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)])
    model.ir_version = 7
    onnx.checker.check_model(model)
    return model.SerializeToString()


def test_half_keeps_the_small_graph_s_numbers():
    pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    import onnx

    from ppmulti.rank.engine import onnx_export

    rng = np.random.default_rng(0)
    data = _small_graph(rng)
    image = rng.random((1, 3, 16, 16), dtype=np.float32)

    def run(blob: bytes) -> np.ndarray:
        return ort.InferenceSession(blob, providers=["CPUExecutionProvider"]).run(None, {"image": image})[0]

    want = run(data)
    half = onnx_export.to_half(data)
    model = onnx.load_from_string(half)
    assert {i.name: i.type.tensor_type.elem_type for i in [*model.graph.input, *model.graph.output]} == {
        "image": onnx.TensorProto.FLOAT, "out": onnx.TensorProto.FLOAT}   # float32 at the edges
    assert [t.data_type for t in model.graph.initializer if t.name == "w"] == [onnx.TensorProto.FLOAT16]
    got = run(half)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=0, atol=SCORE_TOL)
    assert np.abs(got - want).max() > 0   # float16 arithmetic, not the float32 graph again


# ----------------------------------------------------------------------------- real exports of the trained runs
@pytest.fixture(scope="module", params=["yolov5", "ppyoloe"])
def model(request, small_demo):
    """(name, config, overrides, weights, dataset root) of the session's YOLOv5n or PP-YOLOE run (4 epochs on the
    demo set), as test_onnx_export reads them."""
    run = request.getfixturevalue(f"{request.param}_run").path
    return request.param, run / "config.yml", [], run / "weights" / "last.pdparams", small_demo


def _export(model, out: Path, *flags: str) -> Path:
    _, config, _, weights, _ = model
    out.mkdir(parents=True, exist_ok=True)
    proc = run_tool([str(REPO / "tools" / "export.py"), "-c", str(config), "--weights", str(weights),
                     "--output_dir", str(out), "--format", "onnx", *flags], cwd=out)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    onnx_file = Path(proc.stdout.strip().splitlines()[-1].split(" written to ", 1)[1])
    assert onnx_file.name == "model.onnx" and onnx_file.is_file()
    return onnx_file


def _float32_beside(onnx_file: Path) -> bytes:
    """The float32 ONNX model of the Paddle model the export keeps beside model.onnx, converted as export does."""
    from ppmulti.rank.engine.onnx_export import fix_batch

    return fix_batch(compat.paddle_to_onnx(onnx_file.parent, 11), 1)


def _float16_share(onnx_file: Path) -> float:
    """The float16 share of the graph's stored tensors, in bytes: initializers and Constant nodes (where
    paddle2onnx puts the weights unless onnxslim moved them)."""
    import onnx
    from onnx import numpy_helper

    graph = onnx.load(str(onnx_file)).graph
    tensors = [*graph.initializer, *(a.t for n in graph.node if n.op_type == "Constant" for a in n.attribute
                                     if a.name == "value")]
    sizes: dict[int, int] = {}
    for t in tensors:
        sizes[t.data_type] = sizes.get(t.data_type, 0) + numpy_helper.to_array(t).nbytes
    return sizes.get(onnx.TensorProto.FLOAT16, 0) / sum(sizes.values())


@pytest.mark.seam
@pytest.mark.slow
@needs_p2o
def test_half_onnx_matches_float32_in_onnxruntime(model, tmp_path):
    import onnx
    import onnxruntime as ort
    from test_onnx_export import _demo_batches

    slim = importlib.util.find_spec("onnxslim") is not None   # setup.py's export extra asks for it
    onnx_file = _export(model, tmp_path, "--no-nms", "--half", *(["--simplify"] if slim else []))
    float32 = _float32_beside(onnx_file)
    assert _float16_share(onnx_file) > 0.99   # the weights are float16 (a few int64 shape constants stay)
    assert onnx_file.stat().st_size < 0.6 * len(float32)
    if slim:   # onnxslim folded the shape arithmetic (1135 -> 269 nodes for yolov5n)
        nodes = [len(onnx.load_from_string(blob).graph.node) for blob in (onnx_file.read_bytes(), float32)]
        assert nodes[0] < 0.5 * nodes[1], nodes
    half = ort.InferenceSession(str(onnx_file), providers=["CPUExecutionProvider"])
    full = ort.InferenceSession(float32, providers=["CPUExecutionProvider"])
    assert [i.type for i in half.get_inputs()] == [i.type for i in full.get_inputs()]   # float32 inputs
    worst = [0.0, 0.0]
    for feed in _demo_batches(model, 1):
        names = [i.name for i in full.get_inputs()]
        want = full.run(None, {n: feed[n] for n in names})
        got = half.run(None, {n: feed[n] for n in names})
        for k, (w, g) in enumerate(zip(want, got)):
            assert g.dtype == np.float32 and g.shape == w.shape
            worst[k] = max(worst[k], float(np.abs(g - w).max()))
    print(f"{model[0]} float16 vs float32: boxes {worst[0]:.4f} px, scores {worst[1]:.2e}")
    assert worst[0] <= BOX_TOL and worst[1] <= SCORE_TOL, worst
    assert worst[0] > 0   # float16 arithmetic ran, not a float32 graph again


@pytest.mark.seam
@pytest.mark.slow
@needs_p2o
def test_half_onnx_with_nms_in_the_graph_runs(yolov5_run, small_demo, tmp_path):
    """NMS in the graph: it stays float32 behind casts (onnxruntime's CPU has no float16 NonMaxSuppression), and
    onnxruntime loads the graph (paddle2onnx 1.3.1's NMS subgraph failed its shape check, "Gather ... rank >= 1",
    until the converter's inferred shapes were dropped). The numbers are held before NMS, above: the session's
    4-epoch runs score every box near 0.01, so which of two overlapping near-equal boxes NMS keeps is a tie."""
    import onnxruntime as ort
    from test_onnx_export import _demo_batches

    run = yolov5_run.path
    model = ("yolov5", run / "config.yml", [], run / "weights" / "last.pdparams", small_demo)
    onnx_file = _export(model, tmp_path, "--half")
    assert _float16_share(onnx_file) > 0.99
    half = ort.InferenceSession(str(onnx_file), providers=["CPUExecutionProvider"])
    assert [o.type for o in half.get_outputs()] == ["tensor(float)", "tensor(int32)"]
    assert b"NonMaxSuppression" in onnx_file.read_bytes()
    for feed in _demo_batches(model, 1):
        dets, count = half.run(None, {i.name: feed[i.name] for i in half.get_inputs()})
        assert dets.dtype == np.float32 and dets.shape[1] == 6 and int(count[0]) == len(dets) > 0
        assert np.isfinite(dets).all()
