"""`ppmulti evolve --dashboard`: optuna-dashboard on an evolution's study, on loopback; a headless browser finds
its trials."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import optuna
import pytest

from conftest import require_system
from ppmulti.procs.runs import evolve_study as S
from ppmulti.procs.runs.evolve_run import mutated_bounds

REPO = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_dashboard_serves_the_study_and_a_browser_finds_its_trials(tmp_path):
    pytest.importorskip("optuna_dashboard", reason="pip install optuna-dashboard")
    project = tmp_path / "evo"
    base = {"lr0": 0.01, "box": 0.05}
    storage = S.open_storage(S.default_storage(project))
    study = S.open_study(storage, "evo", None, base, "test")
    for i in range(3):   # finished trials as the engine tells them (the base hyps wait queued as trial 0)
        study.add_trial(optuna.trial.create_trial(
            params={"lr0": 0.01 * (i + 2), "box": 0.05}, distributions=S.distributions(base, mutated_bounds()),
            value=0.1 * i, user_attrs={"mAP50": 0.1 * i, "mAP50_95": 0.1 * i}))
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    server = subprocess.Popen([sys.executable, "-m", "ppmulti.cli", "evolve", "--dashboard", "--project", str(project),
                               "--port", str(port)], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
    try:
        first = server.stdout.readline()
        page = f"http://127.0.0.1:{port}/dashboard/studies/1"
        assert first.startswith("evolve: optuna-dashboard of sqlite:///") and first.split(": ", 2)[2].startswith(page)
        deadline, api = time.time() + 60, None
        while api is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/studies/1", timeout=5) as r:
                    api = json.loads(r.read())
            except OSError:
                assert time.time() < deadline and server.poll() is None, "the dashboard did not answer"
                time.sleep(0.3)
        assert [(t["number"], t["state"]) for t in api["trials"]] == [(0, "Waiting")] + [(i, "Complete")
                                                                                          for i in (1, 2, 3)]
        chromium = shutil.which("chromium") or shutil.which("chromium-browser")
        require_system(None if chromium else "chromium is not installed", "apt-get install chromium")
        # a profile of its own in tmp_path, and none of Chromium's own network traffic (the machine has no network)
        dom = subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                              "--disable-background-networking", "--disable-component-update", "--disable-sync",
                              f"--user-data-dir={tmp_path / 'chromium'}", "--dump-dom",
                              "--virtual-time-budget=8000", f"{page}/trials"], capture_output=True, text=True,
                             timeout=120).stdout
        assert all(f"Trial {i}" in dom for i in range(4)), dom[-2000:]
    finally:
        server.send_signal(signal.SIGTERM)
        out, _ = server.communicate(timeout=30)
    assert server.returncode == 0, out
