"""``ppmulti board``: a real VisualDL server on loopback over real logs, read back over its HTTP API."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from conftest import REPO, run_tool

# values exact in float32 (VisualDL stores scalars as float32), so they come back equal
LOSS = {0: 2.5, 1: 1.25, 2: 0.75, 3: 0.5}
MAP50 = {1: 0.125, 3: 0.375}

# loopback only: never route 127.0.0.1 through a proxy from the environment
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _write_run(run: Path) -> Path:
    """A run directory with a small real VisualDL log in run/vdl, as VisualDLHook writes it."""
    from visualdl import LogWriter

    run.mkdir(parents=True, exist_ok=True)
    (run / "config.yml").write_text("epoch: 4\n")
    with LogWriter(logdir=str(run / "vdl")) as writer:
        for step, value in LOSS.items():
            writer.add_scalar(tag="train/loss", value=value, step=step)
        for step, value in MAP50.items():
            writer.add_scalar(tag="eval/mAP50", value=value, step=step)
    return run / "vdl"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _api(port: int, method: str, **params) -> object:
    url = f"http://127.0.0.1:{port}/app/api/{method}"
    if params:
        url += "?" + urllib.parse.urlencode(params)
    with _OPENER.open(url, timeout=10) as resp:
        body = json.loads(resp.read().decode())
    assert body["status"] == 0, body
    return body["data"]


def _wait_for_api(proc: subprocess.Popen, port: int, timeout: float = 60.0) -> list:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            out, err = proc.communicate()
            pytest.fail(f"board exited early with {proc.returncode}:\n{out}\n{err}")
        try:
            return _api(port, "runs")
        except (urllib.error.URLError, ConnectionError, OSError):
            time.sleep(0.3)
    proc.kill()
    out, err = proc.communicate()
    pytest.fail(f"board did not answer on 127.0.0.1:{port} within {timeout}s:\n{out}\n{err}")


def _env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    return env


def _one_error_line(proc) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), proc.stderr
    return lines[0]


@pytest.mark.multiproc
@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "terminate"])
def test_board_serves_the_run_scalars_over_http(tmp_path, stop):
    logdir = _write_run(tmp_path / "run")
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "ppmulti.cli", "board", str(tmp_path / "run"),
                             "--port", str(port)], cwd=REPO, env=_env(), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        runs = _wait_for_api(proc, port)
        assert runs == [str(logdir)]
        tags = _api(port, "scalar/tags")
        assert tags["runs"] == runs and sorted(tags["tags"][0]) == ["eval/mAP50", "train/loss"]
        for tag, written in (("train/loss", LOSS), ("eval/mAP50", MAP50)):
            rows = _api(port, "scalar/list", run=runs[0], tag=tag)  # [[wall ms, step, value], ...]
            assert {step: value for _, step, value in rows} == written, (tag, rows)
            assert [step for _, step, _ in rows] == sorted(written)
        for lang in (None, "de-DE,de;q=0.9"):  # the UI page too, whatever language the browser asks for
            req = urllib.request.Request(f"http://127.0.0.1:{port}/app/index",
                                         headers={"Accept-Language": lang} if lang else {})
            with _OPENER.open(req, timeout=10) as resp:
                assert resp.status == 200 and b"<html" in resp.read().lower()
        proc.send_signal(stop)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, (out, err)
    assert "Traceback" not in err
    assert f"VisualDL: http://127.0.0.1:{port}  (logs: {logdir})" in out.splitlines()


def test_find_logdirs_over_a_directory_of_runs(tmp_path):
    from ppmulti.runs.board import find_logdirs

    a = _write_run(tmp_path / "out" / "a")
    nested = _write_run(tmp_path / "out" / "sweep" / "b")
    (tmp_path / "out" / "no_logs_yet" / "vdl").mkdir(parents=True)  # empty vdl/: not a log
    assert find_logdirs(tmp_path / "out") == [a, nested]
    assert find_logdirs(tmp_path / "out" / "a") == [a]
    assert find_logdirs(a) == [a]


def test_board_without_logs_is_one_line_exit_2(tmp_path):
    (tmp_path / "run").mkdir()
    line = _one_error_line(run_tool(["-m", "ppmulti.cli", "board", str(tmp_path / "run")], env=_env(),
                                    timeout=60))
    assert str(tmp_path / "run") in line and "no VisualDL logs" in line
    line = _one_error_line(run_tool(["-m", "ppmulti.cli", "board", str(tmp_path / "missing")], env=_env(),
                                    timeout=60))
    assert str(tmp_path / "missing") in line


def test_board_port_in_use_is_one_line_exit_2(tmp_path):
    _write_run(tmp_path / "run")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        proc = run_tool(["-m", "ppmulti.cli", "board", str(tmp_path / "run"), "--port", str(port)],
                        env=_env(), timeout=60)
    line = _one_error_line(proc)
    assert f"port {port}" in line and "--port" in line
