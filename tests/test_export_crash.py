"""ONNX export where paddle2onnx cannot do the job: a crash in its native code (SIGABRT, SIGSEGV) ends only the
child process ppmulti/procs/onnx_convert.py runs the conversion in, and the export command prints one line naming
the architecture and the Paddle inference model to use, exits 1, and leaves no temporary directory and no partial
model.onnx; architectures ppdet 2.6 cannot export on one stack are one line naming the other stack."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import pytest
from conftest import run_tool
from launching import launch_env

from ppmulti.common.errors import UserError
from ppmulti.procs import onnx_convert
from ppmulti.rank import compat

# ----------------------------------------------------------------------------- the line and the child, fast


def test_crash_line_names_the_model_and_what_to_use():
    line = onnx_convert.crash_line("TOOD", "tood_r18_fpn_1x_coco", "crashed (killed by signal SIGSEGV)", "2.1.0",
                                   "output_inference/tood_r18_fpn_1x_coco")
    assert "\n" not in line
    for part in ("TOOD (tood_r18_fpn_1x_coco)", "paddle2onnx 2.1.0 crashed (killed by signal SIGSEGV)",
                 "no ONNX file was written", "Paddle inference model written to output_inference/tood_r18"):
        assert part in line, line
    assert "--include paddle" in onnx_convert.crash_line("SSD", "best", "failed", "1.3.1", None)


def _child(monkeypatch, code: str) -> None:
    monkeypatch.setattr(onnx_convert, "child_argv",
                        lambda model_dir, opset, out: [sys.executable, "-c", code, str(out)])


@pytest.mark.parametrize("sig", [signal.SIGABRT, signal.SIGSEGV])
def test_a_child_killed_by_a_signal_is_one_line_and_leaves_no_temp_dir(monkeypatch, tmp_path, sig):
    """A stand-in for paddle2onnx that makes a temporary directory as compat.paddle_to_onnx does, half-writes its
    output and dies by the signal: ConversionFailed (exit code 1) with the signal's name, nothing left in TMPDIR."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp))
    monkeypatch.setattr("tempfile.tempdir", None)   # tempfile reads TMPDIR afresh
    _child(monkeypatch, "import os, sys, tempfile; tempfile.mkdtemp(prefix='ppmulti-onnx-'); "
                        f"open(sys.argv[1], 'wb').write(b'half'); os.kill(os.getpid(), {int(sig)})")
    with pytest.raises(onnx_convert.ConversionFailed) as err:
        onnx_convert.convert(tmp_path / "tood_r18", 11, "TOOD", "2.1.0", keep=tmp_path / "tood_r18")
    assert err.value.exit_code == 1
    assert f"crashed (killed by signal {sig.name})" in str(err.value) and "TOOD (tood_r18)" in str(err.value)
    assert list(tmp.iterdir()) == []


def test_a_failing_child_gives_its_error_and_a_good_one_its_bytes(monkeypatch, tmp_path):
    _child(monkeypatch, "import sys; print('error: paddle2onnx 2.1.0 could not convert: no pd_op.prior_box', "
                        "file=sys.stderr); sys.exit(1)")
    with pytest.raises(onnx_convert.ConversionFailed, match=r"failed \(paddle2onnx 2.1.0 could not convert: no "):
        onnx_convert.convert(tmp_path / "ssd", 11, "SSD", "2.1.0")
    _child(monkeypatch, "import sys; open(sys.argv[1], 'wb').write(b'onnx bytes')")
    assert onnx_convert.convert(tmp_path / "ssd", 11, "SSD", "2.1.0") == b"onnx bytes"


def test_export_refusals_name_the_stack_that_exports():
    detr = compat.export_refusal("DETR", TypeError("(InvalidType) Type promotion only support ..."), (3, 3, 1))
    assert detr and "PPMULTI_PADDLE_VERSION=2.6.2" in detr
    assert compat.export_refusal("DETR", TypeError("Type promotion"), (2, 6, 2)) is None
    assert compat.export_refusal("YOLOv3", ValueError("other"), (3, 3, 1)) is None


def test_a_refusal_is_one_line_from_the_exporter(monkeypatch, tmp_path):
    """inference.export_model turns a recognised to_static error into a UserError and removes the directory ppdet
    had begun (its infer_cfg.yml)."""
    from ppmulti.rank.engine import inference

    def fails(cfg, model, output_dir):
        (Path(output_dir) / cfg["filename"]).mkdir(parents=True)
        (Path(output_dir) / cfg["filename"] / "infer_cfg.yml").write_text("arch: DETR\n")
        raise TypeError("(InvalidType) Type promotion only support calculations between floating-point numbers")

    monkeypatch.setattr(inference, "_ppdet_export", fails)
    monkeypatch.setattr(compat, "installed_version", lambda: (3, 3, 1))
    with pytest.raises(UserError, match=r"DETR \(dino_r18\) cannot be exported on Paddle"):
        inference.export_model({"architecture": "DETR", "filename": "dino_r18"}, None, str(tmp_path / "out"))
    assert list((tmp_path / "out").iterdir()) == []


# ----------------------------------------------------------------------------- the real crash, slow

# PP-YOLO as tests/test_ppdet_zoo.py shrinks it: paddle2onnx aborts on its matrix_nms (SIGABRT; 2.1.0 on Paddle
# 3.3.1 and 1.3.1 on Paddle 2.6.2, measured 2026-12-02 with tools/export.py -c ... --format onnx: exit 134).
SAVE_INIT = """
import sys, paddle
from ppmulti.rank import compat, config as config_mod
compat.import_ppdet()
from ppdet.core.workspace import create
cfg = config_mod.load(sys.argv[1], ["use_gpu=false", "num_classes=3"])
paddle.seed(0)
paddle.save(create(cfg.architecture).state_dict(), "init.pdparams")
"""


@pytest.mark.slow
@pytest.mark.seam
@pytest.mark.skipif(sys.version_info >= (3, 13), reason="paddle2onnx publishes no Python 3.13 wheel")
def test_paddle2onnx_crash_on_a_zoo_model_is_one_line(tmp_path):
    from test_ppdet_zoo import FAMILIES, write_checkout

    rel, files = FAMILIES["ppyolo"]
    root = write_checkout(tmp_path / "PaddleDetection", files)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = launch_env(TMPDIR=str(tmp))
    saved = run_tool(["-c", SAVE_INIT, rel], cwd=root, env=env, timeout=300)
    assert saved.returncode == 0, saved.stderr[-2000:]
    proc = run_tool([str(Path(__file__).resolve().parents[1] / "tools" / "export.py"), "-c", rel,
                     "--format", "onnx", "-o", "use_gpu=false", "num_classes=3", "weights=init.pdparams"],
                    cwd=root, env=env, timeout=600)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    model_dir = Path("output_inference") / Path(rel).stem
    assert f"YOLOv3 ({model_dir.name}): paddle2onnx" in errors[0] and "killed by signal SIGABRT" in errors[0]
    assert f"Paddle inference model written to {model_dir}" in errors[0], errors[0]
    written = sorted(p.name for p in (root / model_dir).iterdir())
    assert compat.exported_program_name() in written and "model.onnx" not in written, written
    assert not [p.name for p in tmp.iterdir()], "temporary files left behind"


def test_a_graph_onnxruntime_refuses_is_one_line_and_no_file(tmp_path):
    """RetinaNet's case (paddle2onnx writes a graph onnxruntime cannot load): one line, exit code 1."""
    pytest.importorskip("onnxruntime")
    from ppmulti.rank.engine import onnx_export

    with pytest.raises(onnx_export.ExportFailed, match=r"RetinaNet \(retina\): onnxruntime cannot load") as err:
        onnx_export.check_converted(b"not an onnx model", "RetinaNet", tmp_path / "retina", "2.1.0")
    assert err.value.exit_code == 1 and "\n" not in str(err.value)
