"""Evolution across "machines" on PostgreSQL: two worker processes with their own PROJECT share one study on a
server the test starts (initdb + pg_ctl on loopback, removed after); one is SIGKILLed mid-trial, and Optuna's
heartbeat fails its trial and the other trains it again. The URL's password shows nowhere."""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from conftest import require_system
from ppmulti.common import procfs
from ppmulti.procs.runs import evolve_study as S

REPO = Path(__file__).resolve().parents[1]


def _pg_tool(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    for candidate in sorted(Path("/usr/lib/postgresql").glob(f"*/bin/{name}"), reverse=True):
        return str(candidate)
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def postgres():
    """A PostgreSQL server on 127.0.0.1 with a password-protected user; yields its URL; stopped and removed after.
    As root the server runs as ``nobody`` (postgres refuses to run as root)."""
    initdb, pg_ctl = _pg_tool("initdb"), _pg_tool("pg_ctl")
    require_system(None if initdb and pg_ctl else "PostgreSQL's initdb/pg_ctl are not installed",
                   "apt-get install postgresql")
    pytest.importorskip("psycopg2", reason="the PostgreSQL driver: pip install psycopg2-binary")
    root = Path(tempfile.mkdtemp(prefix="ppmulti-pg-"))
    as_user: list[str] = []
    if os.getuid() == 0:
        shutil.chown(root, "nobody")
        as_user = ["runuser", "-u", "nobody", "--"]
    password, port = "pw-" + secrets.token_hex(8), _free_port()
    (root / "pw").write_text(password + "\n")
    shutil.chown(root / "pw", "nobody") if as_user else None
    data = root / "data"
    env = {**os.environ, "LC_ALL": "C.UTF-8", "LANG": "C.UTF-8"}
    started = False
    try:
        subprocess.run([*as_user, initdb, "-D", str(data), "-U", "evo", f"--pwfile={root / 'pw'}",
                        "--auth-host=scram-sha-256", "--auth-local=trust", "-E", "UTF8", "--no-sync"],
                       check=True, capture_output=True, env=env, timeout=120)
        subprocess.run([*as_user, pg_ctl, "-D", str(data), "-l", str(root / "server.log"), "-w", "-t", "60", "-o",
                        f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c fsync=off", "start"],
                       check=True, capture_output=True, env=env, timeout=90)
        started = True
        yield f"postgresql://evo:{password}@127.0.0.1:{port}/postgres", password
    finally:
        if started:
            subprocess.run([*as_user, pg_ctl, "-D", str(data), "-m", "immediate", "-w", "stop"],
                           capture_output=True, env=env, timeout=60)
        shutil.rmtree(root, ignore_errors=True)


_WORKER = """
import json, sys, time
from pathlib import Path
from ppmulti.procs.runs.evolve_run import Evolution, EvolveSpec, Slot

class Machine(Evolution):
    def train(self, job, slot):          # a 'training': metrics.json after SECONDS, as the real one writes it
        job.directory.mkdir(parents=True, exist_ok=True)
        print(f"machine: candidate {job.number} started", flush=True)
        time.sleep(float(sys.argv[4]))
        m = {"mAP50": round(0.5 * job.hyp["lr0"] * 10, 6), "mAP50_95": round(0.3 * job.hyp["lr0"] * 10, 6)}
        (job.directory / "metrics.json").write_text(json.dumps(m))
        return 0

project, url, generations = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
spec = EvolveSpec(project=project, generations=generations, train_args=(), base_hyp={"lr0": 0.01, "box": 0.05},
                  slots=(Slot(project.name, ()),), storage=url, study="shared", heartbeat=1)
sys.exit(Machine(spec).run())
"""


@pytest.mark.slow
@pytest.mark.multiproc
def test_two_machines_share_a_postgres_study_and_a_killed_ones_trial_is_rerun(tmp_path, postgres):
    import optuna
    from optuna.trial import TrialState

    url, password = postgres
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    generations = 4

    def machine(name: str, seconds: float) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-c", _WORKER, str(tmp_path / name), url, str(generations),
                                 str(seconds)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    slow = machine("a", 300)                 # machine a: its candidate runs until a dies
    line, seen = "", []
    while "machine: candidate" not in line:
        line = slow.stdout.readline()
        assert line or slow.poll() is None, "".join(seen)
        seen.append(line)
    fast = machine("b", 0.2)                 # machine b, on its own PROJECT, joins the study
    time.sleep(1.0)
    for pid in [*procfs.tree(slow.pid)]:     # machine a is lost: no word, no cleanup
        os.kill(pid, signal.SIGKILL)
    seen.append(slow.communicate(timeout=30)[0])
    out, _ = fast.communicate(timeout=120)
    assert fast.returncode == 0, out

    study = optuna.load_study(study_name="shared", storage=S.with_driver(url))
    trials = study.trials
    done = [t for t in trials if t.state == TrialState.COMPLETE]
    assert len(done) == generations
    lost = [t for t in trials if t.state == TrialState.FAIL and t.user_attrs.get("worker", "").endswith("/a")]
    assert len(lost) == 1, [(t.number, t.state.name, t.user_attrs) for t in trials]
    rerun = [t for t in done if t.system_attrs.get("failed_trial") == lost[0].number]
    assert len(rerun) == 1 and rerun[0].params == lost[0].params and rerun[0].user_attrs["worker"].endswith("/b")
    assert f"training candidate {lost[0].number} (trial {rerun[0].number}) on b" in out
    assert f"{generations}/{generations} generations" in out and "postgresql://evo:***@127.0.0.1" in out
    # the password shows in no console and no file either machine wrote
    assert password not in out + "".join(seen)
    for path in (tmp_path / "a").rglob("*"), (tmp_path / "b").rglob("*"):
        for f in path:
            assert not f.is_file() or password.encode() not in f.read_bytes(), f
    assert len((tmp_path / "b" / "evolve.csv").read_text().splitlines()) == 1 + generations
