"""A start-up refusal under `ppmulti launch`: every rank refuses in the same words, the console shows the line
once, nothing restarts, and the run directory the refused run made is removed (the corrected command gets exp)."""

from __future__ import annotations

import io
import subprocess
import sys

import pytest

from launching import REPO, launch_env
from ppmulti.common.rundir import unstarted
from ppmulti.procs.launch.console import LauncherOutput
from ppmulti.procs.launch.runner import refused_at_start


def test_a_run_directory_is_unstarted_until_it_holds_more_than_its_start(tmp_path):
    run = tmp_path / "exp"
    (run / "weights").mkdir(parents=True)
    (run / "logs").mkdir()
    for name in ("config.yml", "opt.yaml", "args.yaml", "run_plan.json", "train.log", "logs/rank1.log"):
        (run / name).write_text("x\n")
    assert unstarted(run)
    (run / "weights" / "last.pdparams").write_bytes(b"w")
    assert not unstarted(run)
    (run / "weights" / "last.pdparams").unlink()
    (run / "results.csv").write_text("epoch\n")
    assert not unstarted(run) and not unstarted(tmp_path / "none")


def test_only_ranks_that_all_refused_are_a_refusal():
    assert refused_at_start({0: "exited with code 2", 1: "exited with code 2"})
    assert not refused_at_start({0: "exited with code 2", 1: "RuntimeError: boom"})
    assert not refused_at_start({})


def _console(lines: list[tuple[str, str]]) -> str:
    """What the console shows of ``lines`` ((stream, text) in the order the launcher's readers take them)."""
    out, err = io.StringIO(), io.StringIO()
    output = LauncherOutput(None, {}, stdout=out, stderr=err)
    for stream, text in lines:
        output._copy(io.BytesIO(text.encode() + b"\n"), out if stream == "out" else err)
    return out.getvalue() + err.getvalue()


def test_paddles_error_detail_does_not_repeat_what_the_console_showed():
    error = "error: data.yaml: nc 2 but a label has class 2; fix the label or the yaml"
    shown = _console([("out", "18:00:00 INFO start"), ("out", error), ("out", ""),
                      ("err", "LAUNCH INFO 2026-11-27 18:00:01,000 ------- ERROR LOG DETAIL -------"),
                      ("out", "00:00 INFO start"), ("out", error), ("out", ""),
                      ("out", "Traceback (most recent call last):"), ("out", "ValueError: rank 1's own")])
    assert shown.splitlines() == ["18:00:00 INFO start", error, "", "Traceback (most recent call last):",
                                  "ValueError: rank 1's own"]
    # without Paddle's detail only the refusal's line is kept once (a second rank's same words)
    assert _console([("out", "epoch 1"), ("out", "epoch 1"), ("out", error), ("out", error)]).splitlines() == \
        ["epoch 1", "epoch 1", error]


@pytest.mark.slow
@pytest.mark.multiproc
def test_a_refusal_in_every_rank_prints_once_and_leaves_no_run_directory(tmp_path):
    from ppmulti.common.synthdata import generate

    generate(tmp_path / "data", fmt="yolo", n_train=4, n_val=2, size=64, seed=5)
    (tmp_path / "two.yaml").write_text(f"path: {tmp_path / 'data'}\ntrain: images/train\nval: images/val\n"
                                       f"names: [a, b]\n")   # the labels use class 2: refused once parsed
    earlier = tmp_path / "runs" / "train" / "exp"
    (earlier / "weights").mkdir(parents=True)
    (earlier / "weights" / "last.pdparams").write_bytes(b"an earlier run's")
    proc = subprocess.run([sys.executable, "-m", "ppmulti.cli", "launch", "--nproc_per_node", "2",
                           str(REPO / "tools" / "train.py"), "--data", "two.yaml", "--cfg", "yolov5n", "--weights",
                           "", "--epochs", "1", "--imgsz", "64", "--workers", "0"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300, env=launch_env())
    console = proc.stdout + proc.stderr
    errors = [line for line in console.splitlines() if line.startswith("error:")]
    assert proc.returncode == 2, console
    assert len(errors) == 1 and "class id 2 but the data yaml declares nc=2" in errors[0], console
    assert "Traceback" not in console and "--max_restarts" not in console
    assert sorted(p.name for p in (tmp_path / "runs" / "train").iterdir()) == ["exp"]   # exp2 was made, then removed
    assert (earlier / "weights" / "last.pdparams").read_bytes() == b"an earlier run's"
