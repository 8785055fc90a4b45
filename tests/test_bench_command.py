"""``ppmulti bench``'s command line: where a measuring run writes its report, and bad input stopped before anything
runs or any directory is made."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ppmulti.common.errors import UserError
from ppmulti.procs.bench import command


def _bench(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ppmulti.cli", "bench", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=60)


def test_default_output_is_a_fresh_run_directory_under_the_current_one(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    first, second = command.output_dir(None), command.output_dir(None)
    assert (first, second) == (Path("runs/bench/exp"), Path("runs/bench/exp2"))
    assert (tmp_path / "runs/bench/exp").is_dir() and (tmp_path / "runs/bench/exp2").is_dir()


def test_out_is_taken_as_given(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert command.output_dir("mine") == Path("mine")
    assert command.output_dir("mine") == Path("mine")   # the same place again: --out means that directory
    assert not (tmp_path / "runs").exists()
    (tmp_path / "a_file").write_text("x")
    with pytest.raises(UserError, match="--out a_file: exists and is not a directory"):
        command.output_dir("a_file")


def test_help_says_where_results_go(tmp_path):
    r = _bench("--help", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "runs/bench/expN" in " ".join(r.stdout.split())


@pytest.mark.parametrize("args, message", [
    (["--ranks", "0"], "error: --ranks '0': expected numbers >= 1"),
    (["--ranks", "1,2", "--batch", "3"], "error: --batch 3 is not divisible by 2 ranks"),
    (["--data", "no_such_dir"], "error: --data no_such_dir: no such directory"),
])
def test_bad_input_is_one_error_line_and_makes_no_run_directory(tmp_path, args, message):
    r = _bench(*args, cwd=tmp_path)
    assert r.returncode != 0
    errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith(message), r.stderr
    assert list(tmp_path.iterdir()) == []
