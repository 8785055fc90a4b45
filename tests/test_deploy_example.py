"""The deployment example (examples/deploy.py, shown in docs/amp-export.md): an exported model run from Python in
Paddle Inference and in onnxruntime prints the same boxes."""

from __future__ import annotations

import subprocess
import sys

import pytest

from conftest import REPO, run_tool

EXAMPLE = REPO / "examples" / "deploy.py"


def _rows(text: str) -> list[tuple[str, list[float]]]:
    rows = []
    for line in text.strip().splitlines():
        name, *numbers = line.split()
        rows.append((name, [float(v) for v in numbers]))
    return rows


def test_the_page_shows_the_example():
    page = (REPO / "docs" / "amp-export.md").read_text()
    assert "examples/deploy.py" in page
    source = EXAMPLE.read_text()
    for part in ("onnxruntime.InferenceSession", "inference.create_predictor", "infer_cfg.yml"):
        assert part in source
    import ast

    imported = {(n.module if isinstance(n, ast.ImportFrom) else a.name).split(".")[0]
                for n in ast.walk(ast.parse(source)) if isinstance(n, (ast.Import, ast.ImportFrom))
                for a in n.names}
    # what the page says it needs: Paddle or onnxruntime, numpy, OpenCV and PyYAML (no ppmulti, no ppdet)
    assert imported == {"__future__", "argparse", "pathlib", "cv2", "numpy", "yaml", "paddle", "onnxruntime"}, imported


@pytest.mark.slow
@pytest.mark.skipif(sys.version_info >= (3, 13), reason="paddle2onnx publishes no Python 3.13 wheel")
def test_deploy_example_prints_the_same_boxes_from_paddle_inference_and_onnxruntime(ppyoloe_run, small_demo,
                                                                                    tmp_path):
    run = ppyoloe_run.path
    out = tmp_path / "output_inference"
    for extra in ([], ["--format", "onnx"]):   # the Paddle inference model, then model.onnx beside it
        proc = run_tool([str(REPO / "tools" / "export.py"), "-c", str(run / "config.yml"), "--weights",
                         str(run / "weights" / "best.pdparams"), "--output_dir", str(out), *extra], cwd=tmp_path)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    model_dir = out / "config"
    assert (model_dir / "model.onnx").is_file() and (model_dir / "infer_cfg.yml").is_file(), sorted(out.rglob("*"))
    image = sorted((small_demo / "images" / "val").glob("*.jpg"))[1]
    printed = {}
    for runtime, flags in (("paddle", []), ("onnx", ["--onnx"])):
        # the example as a user runs it: its own interpreter, no ppmulti on the path
        proc = subprocess.run([sys.executable, str(EXAMPLE), str(model_dir), str(image), "--threshold", "0.05",
                               *flags], capture_output=True, text=True, timeout=300, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr[-3000:]
        printed[runtime] = _rows(proc.stdout)
    assert printed["paddle"], "no box over 0.05 on a demo image from a trained model"
    assert [n for n, _ in printed["paddle"]] == [n for n, _ in printed["onnx"]]
    assert all(n in ("rectangle", "ellipse", "triangle") for n, _ in printed["paddle"])
    for (_, a), (_, b) in zip(printed["paddle"], printed["onnx"]):
        assert abs(a[0] - b[0]) <= 0.002 and all(abs(x - y) <= 0.2 for x, y in zip(a[1:], b[1:])), (a, b)
    bad = subprocess.run([sys.executable, str(EXAMPLE), str(model_dir), str(tmp_path / "none.jpg")],
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode != 0 and bad.stderr.strip().splitlines()[-1].startswith("error: "), bad.stderr
