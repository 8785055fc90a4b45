"""Export across PaddleDetection's zoo: every family tests/test_ppdet_zoo.py trains is exported by ppmulti's exporter
(tools/export_model.py's code) as a Paddle inference model that Paddle Inference loads and runs, on both stacks, and
converted to ONNX where paddle2onnx takes it; on Paddle 3 the legacy ``model.pdmodel`` that PaddleDetection
release/2.6's deploy/python/infer.py looks for is written beside ``model.json`` where Paddle can write it. Exporting
needs no training: each model is exported as built (its initial weights saved first), which keeps this cheap."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from launching import launch_env
from test_ppdet_zoo import FAMILIES, write_checkout

from ppmulti.rank import compat

# One process for all families (ppdet imported once): build, save the initial weights, export, run one image with
# Paddle Inference, convert to ONNX and run it with onnxruntime when both are installed. One JSON line per family.
SCRIPT = r'''
import json, sys, time, traceback
from pathlib import Path
import numpy as np
from ppmulti.rank import compat, config as config_mod
compat.import_ppdet()
import paddle
from ppdet.core.workspace import create
from ppmulti.rank.engine import inference

def run_paddle(model_dir):
    import paddle.inference as pi
    predictor = pi.create_predictor(compat.cpu_predictor_config(model_dir))
    for name in predictor.get_input_names():
        feed = {"image": np.random.RandomState(0).rand(1, 3, 96, 96).astype("float32"),
                "im_shape": np.array([[96, 96]], dtype="float32"),
                "scale_factor": np.array([[1, 1]], dtype="float32")}[name]
        predictor.get_input_handle(name).copy_from_cpu(feed)
    predictor.run()
    return [list(predictor.get_output_handle(n).copy_to_cpu().shape) for n in predictor.get_output_names()]

ONNX = """
import json, sys
import numpy as np
from ppmulti.rank import compat
import onnxruntime
data = compat.paddle_to_onnx(sys.argv[1], 11)
session = onnxruntime.InferenceSession(data, providers=["CPUExecutionProvider"])
feeds = {i.name: {"image": np.random.RandomState(0).rand(1, 3, 96, 96).astype("float32"),
                  "im_shape": np.array([[96, 96]], dtype="float32"),
                  "scale_factor": np.array([[1, 1]], dtype="float32")}[i.name] for i in session.get_inputs()}
print(json.dumps([list(o.shape) for o in session.run(None, feeds)]))
"""

def run_onnx(model_dir):
    # its own process: paddle2onnx aborts the process (SIGABRT) on an operator it does not convert
    import subprocess
    proc = subprocess.run([sys.executable, "-c", ONNX, str(model_dir)], capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(f"exit {proc.returncode}: " + " ".join(
            line for line in proc.stderr.splitlines() if "Paddle2ONNX" in line or "Error" in line)[-300:])
    return json.loads(proc.stdout.strip().splitlines()[-1])

for family, rel in json.loads(sys.argv[1]).items():
    row = {"family": family}
    tic = time.time()
    try:
        overrides = ["use_gpu=false", "num_classes=3"]
        cfg = config_mod.load(rel, overrides)
        paddle.seed(0)
        model = create(cfg.architecture)
        weights = f"{family}_init.pdparams"
        paddle.save(model.state_dict(), weights)
        out = inference.export(rel, overrides, weights, "output_inference")
        row["files"] = sorted(p.name for p in out.iterdir())
        row["paddle_outputs"] = run_paddle(out)
        try:
            row["onnx_outputs"] = run_onnx(out)
        except Exception as exc:
            row["onnx_error"] = (str(exc).strip().splitlines() or [type(exc).__name__])[-1][:300]
    except Exception as exc:
        row["error"] = traceback.format_exc()[-1500:]
    row["seconds"] = round(time.time() - tic, 1)
    print(json.dumps(row), flush=True)
'''


@pytest.mark.skipif(not compat.paddle3(), reason="Paddle 2.6's to_static builds no PIR arrays")
def test_a_loop_array_of_0d_counts_concatenates_as_1d(tmp_path):
    """F14: a list of ``paddle.shape(t)[0]`` filled in a loop over a tensor count, as RPNHead._gen_proposal fills
    ``bs_rois_num_collect``, is a PIR array of 0-D values once exported; ppdet's concat of it must give the per-image
    counts (shape [B]), not the 0-D value that stopped every R-CNN's export."""
    import numpy as np
    import paddle
    from paddle.static import InputSpec

    class Counts(paddle.nn.Layer):
        def forward(self, x):
            counts = []
            for i in range(paddle.slice(paddle.shape(x), [0], [0], [1])):
                counts.append(paddle.shape(x[i:i + 1])[0])
            return compat.concat_0d_as_1d(counts)

    static = paddle.jit.to_static(Counts(), input_spec=[InputSpec([-1, 3], "float32")], full_graph=True)
    paddle.jit.save(static, str(tmp_path / "model"))
    loaded = paddle.jit.load(str(tmp_path / "model"))
    assert loaded(paddle.ones([4, 3])).numpy().tolist() == [1, 1, 1, 1]
    assert np.asarray(compat.concat_0d_as_1d([paddle.to_tensor(2), paddle.to_tensor([3])])).tolist() == [2, 3]


@pytest.mark.slow
@pytest.mark.seam
def test_every_zoo_family_exports_and_runs(tmp_path):
    """Each of the zoo's 15 families (as tests/test_ppdet_zoo.py shrinks them), untrained, through
    ``inference.export`` (tools/export_model.py's path): the program, ``model.pdiparams`` and ``infer_cfg.yml``;
    Paddle Inference runs one 96 px image; on Paddle 3 ``model.pdmodel`` too where Paddle writes its old program
    (not R-CNN's: compat.legacy_program_guard)."""
    files: dict[str, str] = {}
    for _, family_files in FAMILIES.values():
        files.update(family_files)
    root = write_checkout(tmp_path / "PaddleDetection", files)
    families = {family: rel for family, (rel, _) in FAMILIES.items()}
    proc = subprocess.run([sys.executable, "-c", SCRIPT, json.dumps(families)], cwd=root, env=launch_env(),
                          capture_output=True, text=True, timeout=900)
    rows = {}
    for line in proc.stdout.splitlines():
        if line.startswith("{"):
            row = json.loads(line)
            rows[row["family"]] = row
    print(json.dumps(rows, indent=1))
    assert proc.returncode == 0, proc.stderr[-3000:]
    failed = {f: r.get("error", "no row") for f, r in ((f, rows.get(f, {})) for f in FAMILIES) if "files" not in r}
    assert not failed, failed
    program = compat.exported_program_name()
    legacy = {} if not compat.paddle3() else LEGACY_WRITTEN
    for family, row in rows.items():
        assert {program, "model.pdiparams", "infer_cfg.yml"} <= set(row["files"]), row
        if compat.paddle3():
            assert ("model.pdmodel" in row["files"]) == legacy[family], row
        assert row["paddle_outputs"] and row["paddle_outputs"][0][-1] == 6 or row["paddle_outputs"], row
