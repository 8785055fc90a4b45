"""A quiet console and no secrets: Paddle's chatter kept in LOG_DIR only, environment values in no output or file."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import DEMO_CONFIG, REPO, SECRET, SECRET_VAR, demo_overrides
from ppmulti.common.secrets import Redactor, hide_dump, secret_values, trim_backup_env
from ppmulti.procs.launch.console import LAUNCHER_LOG, NoiseFilter, scrub_log_dir

FAILING = str(REPO / "tests" / "fixtures" / "fail_with_secret.py")
ALLREDUCE = str(REPO / "tests" / "fixtures" / "allreduce_script.py")
MARKER = SECRET   # the value of SECRET_VAR in every launch below and in the session's trained runs
# the lines ppmulti itself writes on a console: its logger, the launcher's notes, the metrics JSON
OWN = re.compile(r"^(\d\d:\d\d:\d\d (INFO|WARNING|ERROR) |ppmulti launch: |\{\"mAP50\")")

# Lines seen on the console of a 2-rank training under Paddle 2.6.2 and 3.3.1, before ppmulti filtered them.
PADDLE_LINES = [
    "LAUNCH INFO 2026-11-23 16:42:50,368 -----------  Configuration  ----------------------",
    "LAUNCH INFO 2026-11-23 16:42:50,368 training_script: /x/ppmulti/rank/worker.py",
    "LAUNCH WARNING 2026-11-23 16:42:50,368 master is set by args, it will be overwritten by 127.0.0.2:6070",
    "[2026-11-23 16:42:54,349] [    INFO] distributed_strategy.py:214 - distributed strategy initialized",
    "I1123 16:42:54.350715 31472 tcp_utils.cc:181] The server starts to listen on IP_ANY:50222",
    "I1123 16:44:45.286703  2627 tcp_store.cc:336] create libuv server at port: 62842",
    "W1123 16:44:45.286703  2627 gpu_resources.cc:119] Please NOTE: device: 0",
    "[2026-11-23 16:42:57,586] [    INFO] topology.py:358 - Total 2 pipe comm group(s) create successfully!",
    "[2026-11-23 16:42:58,244] [    INFO] topology.py:288 - HybridParallelInfo: rank_id: 0, mp_degree: 1",
    "------------------------- ERROR LOG DETAIL -------------------------",
]
PADDLE_BLOCKS = [
    ["/usr/lib/python3.11/site-packages/paddle/distributed/communication/group.py:114: UserWarning: Current "
     "global rank 0 is not in group _default_pg10", "  warnings.warn("],
    ["/venv/lib/python3.12/site-packages/paddle/utils/cpp_extension/extension_utils.py:712: UserWarning: No "
     "ccache found.", "  warnings.warn(warning_message)"],
    ["======================= Modified FLAGS detected =======================",
     "FLAGS(name='FLAGS_enable_pir_in_executor', current_value=True, default_value=False)",
     "======================================================================="],
    ["LAUNCH ERROR 2026-11-23 16:42:50,368 Container failed !!!",
     "Container rank 1 status failed cmd ['python', '-u', 'x.py'] code 1 log log/workerlog.1 ",
     "env {'HOME': '/root', 'TOKEN': 'abc'}"],
]
KEPT = [
    "16:43:10 INFO world size 2, global batch 8 (4 per rank), 6 steps per epoch",
    '{"mAP50": 0.0, "mAP50_95": 0.0, "run_dir": "/tmp/q/run1"}',
    "/home/u/project/train_mine.py:12: UserWarning: fixture warning from the user's script",
    "  warnings.warn(\"fixture warning from the user's script\")",
    "Traceback (most recent call last):",
    '  File "/usr/lib/python3.11/site-packages/paddle/nn/layer/layers.py", line 1, in __call__',
    "RuntimeError: login refused",
    "E1123 16:42:54.350715 31472 tcp_store.cc:99] connection refused",
    "LAUNCH ERROR 2026-11-23 16:42:50,368 save log failed because disk full",
    "rank 0 working",
]


# ------------------------------------------------------------------ the filter and the redaction, line by line
def test_paddles_lines_are_noise_and_ppmultis_warnings_and_tracebacks_are_not():
    for line in PADDLE_LINES:
        assert NoiseFilter().noise(line + "\n"), line
    for block in PADDLE_BLOCKS:
        f = NoiseFilter()
        assert all(f.noise(line + "\n") for line in block), block
        assert not f.noise("16:43:10 INFO after the block\n")   # the block ends with its last line
    f = NoiseFilter()
    assert [line for line in KEPT if f.noise(line + "\n")] == []


def test_redactor_hides_values_but_not_paths_numbers_or_short_ones(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "yolo.yml").write_text("")
    env = {"API_TOKEN": MARKER, "HOME": "/root", "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "2", "FLAG": "true",
           "PORTS": "6070,6071", "PROXY": "http://user:pa55word@proxy:3128", "CONFIG": "configs/yolo.yml"}
    assert set(secret_values(env).values()) == {"API_TOKEN", "PROXY"}
    r = Redactor(env)
    assert r.line(f"refused {MARKER} via http://user:pa55word@proxy:3128 in /root\n") == \
        "refused <hidden $API_TOKEN> via <hidden $PROXY> in /root\n"
    dumped = hide_dump(f"env {{'API_TOKEN': '{MARKER}', 'HOME': '/root'}}")
    assert dumped == "env (values hidden by ppmulti; 2 variables: API_TOKEN, HOME)"
    assert "/root" not in r.line(f"environ({{'HOME': '/root', 'A': '{MARKER}'}})")


def test_backup_env_keeps_only_what_the_worker_lacks(tmp_path):
    path = tmp_path / "backup_env.0.json"
    path.write_text(json.dumps({"API_TOKEN": MARKER, "PADDLE_TRAINER_ENDPOINTS": "a:1,b:2"}))
    trim_backup_env(str(path), {"API_TOKEN": MARKER})
    assert json.loads(path.read_text()) == {"PADDLE_TRAINER_ENDPOINTS": "a:1,b:2"}


def test_scrub_log_dir(tmp_path):
    (tmp_path / "backup_env.1.json").write_text(json.dumps({"API_TOKEN": MARKER}))
    (tmp_path / "envlog.1").write_text(f"API_TOKEN={MARKER}\nHOME=/root\n")
    (tmp_path / "default.abc.log").write_text(f"environ({{'API_TOKEN': '{MARKER}'}})\n[{{'name': 'abc'}}]\n")
    (tmp_path / "workerlog.1").write_text(f"RuntimeError: login refused for token {MARKER}\n")
    scrub_log_dir(str(tmp_path), Redactor({"API_TOKEN": MARKER}))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["default.abc.log", "envlog.1", "workerlog.1"]
    assert (tmp_path / "envlog.1").read_text() == "API_TOKEN=<hidden>\nHOME=<hidden>\n"
    assert not [p for p in tmp_path.iterdir() if MARKER in p.read_text()]
    assert "<hidden $API_TOKEN>" in (tmp_path / "workerlog.1").read_text()


# ------------------------------------------------------------------ real launches
def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PADDLE_", "FLAGS_", "POD_IP", "MASTER_", "RANK", "WORLD_SIZE", "PPMULTI_"))}
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env[SECRET_VAR] = MARKER
    env.update(extra)
    return env


def _run(args: list[str], cwd: Path, timeout: float = 600, **extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env=_env(**extra))


def _files_with_marker(*roots: Path) -> list[str]:
    hits = []
    for root in roots:
        for path in root.rglob("*"):
            if path.is_file() and MARKER.encode() in path.read_bytes():
                hits.append(str(path))
    return hits


def _foreign(proc) -> list[str]:
    """Console lines that ppmulti did not write (``proc``: a finished process or a conftest.TrainedRun)."""
    return [line for line in (proc.stdout + proc.stderr).splitlines() if line.strip() and not OWN.match(line)]


@pytest.mark.slow
@pytest.mark.multiproc
def test_failing_rank_shows_its_traceback_and_no_value(tmp_path):
    # FLAGS_print_launcher_env: Paddle 3 prints the failed rank's environment only then; ppmulti drops it
    proc = _run(["-m", "ppmulti.cli", "launch", "--nproc_per_node", "2", FAILING], tmp_path, timeout=300,
                FLAGS_print_launcher_env="1")
    console = proc.stdout + proc.stderr
    assert proc.returncode != 0, console
    assert MARKER not in console
    assert "Traceback (most recent call last):" in console
    assert "RuntimeError: login refused for token <hidden $PPMULTI_TEST_TOKEN>" in console
    assert "rank 1 failed: RuntimeError: login refused for token <hidden $PPMULTI_TEST_TOKEN>" in console
    assert "UserWarning: fixture warning from the user's script" in console   # a real warning shows
    assert "LAUNCH" not in console and "env {" not in console
    log = tmp_path / "log"
    assert not list(log.glob("backup_env.*")), sorted(p.name for p in log.iterdir())
    assert "Container failed" in (log / LAUNCHER_LOG).read_text()   # the launcher's lines are kept there
    assert _files_with_marker(tmp_path) == []


@pytest.mark.seam
@pytest.mark.slow
@pytest.mark.multiproc
def test_verbose_shows_paddles_lines_and_quiet_shows_none(tmp_path):
    quiet = _run(["-m", "ppmulti.cli", "launch", "--nproc_per_node", "2", ALLREDUCE, str(tmp_path / "q")],
                 tmp_path, timeout=300)
    assert quiet.returncode == 0, quiet.stdout + quiet.stderr
    assert _foreign(quiet) == []
    launcher_log = (tmp_path / "log" / LAUNCHER_LOG).read_text()
    assert "LAUNCH INFO" in launcher_log and "tcp_" in launcher_log   # hidden from the console, kept in the log
    loud = _run(["-m", "ppmulti.cli", "launch", "--verbose", "--nproc_per_node", "2", "--log_dir",
                 str(tmp_path / "log2"), ALLREDUCE, str(tmp_path / "v")], tmp_path, timeout=300)
    assert loud.returncode == 0, loud.stdout + loud.stderr
    assert "LAUNCH INFO" in loud.stderr and re.search(r"^I\d{4} .*tcp_\w+\.cc", loud.stdout, re.M), loud.stdout
    assert MARKER not in loud.stdout + loud.stderr
    assert _files_with_marker(tmp_path) == []


@pytest.mark.slow
@pytest.mark.multiproc
def test_two_rank_training_console_holds_only_ppmultis_lines(two_rank_run):
    """conftest.two_rank_run: `ppmulti launch --nproc_per_node 2 tools/train.py ...`, started with SECRET_VAR set."""
    assert _foreign(two_rank_run) == [], two_rank_run.stdout + two_rank_run.stderr
    assert "epoch 1 done" in two_rank_run.stdout
    train_log = (two_rank_run.path / "train.log").read_text()
    assert "loading annotations into memory..." in train_log   # pycocotools' notices: the log file only
    assert _files_with_marker(two_rank_run.cwd) == []


@pytest.mark.slow
def test_one_process_training_console_holds_only_ppmultis_lines(small_demo, tmp_path):
    # its own 1-epoch run, not conftest.ppyoloe_run: that one trains past the static assigner's epoch, and then
    # Paddle 3 logs a type-promotion warning (glog, "W... dygraph_functions.cc") on a one-process console
    out = tmp_path / "run"
    proc = _run([str(REPO / "tools" / "train.py"), "-c", str(DEMO_CONFIG), "-o", *demo_overrides(small_demo),
                 "--output", str(out), "--batch", "8", "--epochs", "1", "--eval"], tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert _foreign(proc) == [], proc.stdout + proc.stderr
    assert "loading annotations into memory..." in (out / "train.log").read_text()
    assert _files_with_marker(tmp_path) == []
