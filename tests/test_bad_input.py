"""Bad input that the other test files do not already cover: one line naming the problem, exit 2, no traceback.

In-process where the answer comes before any training (ppdet is imported once for the whole file)."""

from __future__ import annotations

import pytest

from conftest import DEMO_CONFIG, demo_overrides


def _train(capsys, *argv: str) -> str:
    from ppmulti.procs.train_command import main

    code = main(list(argv))
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert code == 2 and len(lines) == 1, (code, err[-2000:])
    assert "Traceback" not in err
    return lines[0]


@pytest.fixture
def base(small_demo, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)   # a refused run may have made its output/<config> directory: not in the checkout
    return ["-c", str(DEMO_CONFIG), "-o", *demo_overrides(small_demo)]


def test_pytorch_weights_say_what_to_do(capsys, base, tmp_path):
    pt = tmp_path / "yolov5s.pt"
    pt.write_bytes(b"PK\x03\x04 not a paddle file")
    line = _train(capsys, *base, "--weights", str(pt), "--epochs", "1")
    assert "yolov5s.pt" in line and "not a PyTorch zip checkpoint" in line   # a real one converts (test_pretrained)


def test_checkpoint_from_another_model_names_the_parameter(capsys, base, tmp_path):
    import paddle

    bad = tmp_path / "other.pdparams"
    paddle.save({"yolo_head.pred_cls.0.weight": paddle.zeros([7, 7, 3, 3])}, str(bad))
    line = _train(capsys, *base, "--weights", str(bad), "--epochs", "1")
    assert "yolo_head.pred_cls.0.weight" in line and "shape" in line


def test_truncated_checkpoint_on_resume(capsys, base, tmp_path):
    run = tmp_path / "run"
    (run / "weights").mkdir(parents=True)
    (run / "weights" / "last.pdstate").write_bytes(b"\x80\x04truncated")
    line = _train(capsys, *base, "--resume", str(run))
    assert "last.pdstate" in line and "truncated" in line


def test_resume_without_a_checkpoint(capsys, base, tmp_path):
    line = _train(capsys, *base, "--resume", str(tmp_path))
    assert "--resume" in line and str(tmp_path) in line


def test_gpu_that_does_not_exist(capsys, base):
    line = _train(capsys, *base, "--device", "3")
    assert "GPU 3 does not exist" in line and "--device cpu" in line


def test_nproc_zero(capsys, base):
    line = _train(capsys, *base, "--device", "cpu", "--nproc", "0")
    assert "--nproc 0" in line


def test_bad_cpu_threads_setting(capsys, base, monkeypatch):
    monkeypatch.setenv("PPMULTI_CPU_THREADS", "many")
    line = _train(capsys, *base, "--epochs", "1")
    assert "PPMULTI_CPU_THREADS" in line and "many" in line


def test_malformed_override(capsys, base):
    line = _train(capsys, *base, "epoch")
    assert "'epoch'" in line and "key=value" in line
