"""A user's own working directory and signals (issue 33): files named ``log``, ``runs`` or ``output`` where ppmulti or
Paddle's launcher would write, and SIGTERM/SIGINT to ``ppmulti launch`` (what was saved, the command that resumes,
exit 128 + the signal)."""

from __future__ import annotations

import json
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import DEMO_CONFIG, REPO, demo_overrides
from launching import ALLREDUCE, launch_env
from ppmulti.common import envvars as E
from ppmulti.common.errors import UserError
from ppmulti.common.rundir import blocking_file, check_run_place, new_run_dir, resume_command
from ppmulti.procs.launch.command import run_place, user_command
from ppmulti.procs.launch.runner import ALT_LOG_DIR, choose_log_dir, interruption_lines

TRAIN = str(REPO / "tools" / "train.py")


# ---------------------------------------------------------------------------------------------- a file named log
def test_log_dir_is_paddles_own_unless_a_file_stands_there(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert choose_log_dir(None, "log") == (None, None)          # nothing there: Paddle's default, nothing passed
    (tmp_path / "log").mkdir()
    assert choose_log_dir(None, "log") == (None, None)          # a directory: Paddle writes into it as always
    (tmp_path / "log").rmdir()
    (tmp_path / "log").write_text("output of an earlier `cmd > log`\n")
    chosen, note = choose_log_dir(None, "log")
    assert chosen == ALT_LOG_DIR
    assert note == f"log is a file, so Paddle's logs go to {ALT_LOG_DIR}/ instead (--log_dir DIR picks another place)"
    assert choose_log_dir("mylogs", "log") == ("mylogs", None)   # the user's --log_dir is taken as given
    (tmp_path / ALT_LOG_DIR).write_text("")
    with pytest.raises(UserError, match=f"log and {ALT_LOG_DIR} are files.*pass --log_dir DIR"):
        choose_log_dir(None, "log")


def test_a_log_dir_that_is_a_file_is_refused_by_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "notes.txt").write_text("")
    with pytest.raises(UserError, match=r"^--log_dir notes.txt: notes.txt is a file, not a directory; pass another"):
        choose_log_dir("notes.txt", "log")
    with pytest.raises(UserError, match=r"^--log_dir notes.txt/x: notes.txt is a file"):
        choose_log_dir("notes.txt/x", "log")


def test_the_ssh_fan_out_beside_a_file_named_log_sends_every_nodes_logs_elsewhere(tmp_path):
    (tmp_path / "log").write_text("")
    proc = _cli(["launch", "--dry-run", "--nodes", "127.0.0.2,127.0.0.3", "--nproc_per_node", "1", TRAIN, "-c",
                 "x.yml"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.startswith("ppmulti launch: log is a file, so Paddle's logs go to ppmulti-log/ instead")
    assert f"--log_dir {ALT_LOG_DIR}/node0" in proc.stdout and f"--log_dir {ALT_LOG_DIR}/node1" in proc.stdout


# --------------------------------------------------------------------------------- files named runs and output
def test_a_file_in_the_way_of_a_run_directory_is_named(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert blocking_file("runs/train/exp") is None
    Path("runs").write_text("")
    assert blocking_file("runs/train/exp") == Path("runs")
    with pytest.raises(UserError) as exc:
        new_run_dir("runs/train", "exp", where="--project DIR")
    assert str(exc.value) == ("runs is a file, so the run directory runs/train/exp cannot be made there: move or "
                              "rename the file, or pick another place with --project DIR")
    Path("output").write_text("")
    with pytest.raises(UserError, match="^output is a file, so the run directory output/cfg cannot be made there"):
        new_run_dir("output", "cfg", exist_ok=True, where="-o save_dir=DIR")
    # a file named like the run itself is stepped over (numbered), or named when the run must be that directory
    Path("out").mkdir()
    Path("out/exp").write_text("")
    assert new_run_dir("out", "exp") == Path("out/exp2")
    with pytest.raises(UserError, match="^out/exp is a file"):
        check_run_place("out", "exp", exist_ok=True)
    assert not Path("runs").is_dir() and Path("output").is_file()   # nothing of the user's was touched


def _config(tmp_path: Path, save_dir: str | None) -> Path:
    (tmp_path / "base.yml").write_text("epoch: 1\n" + (f"save_dir: {save_dir}\n" if save_dir else ""))
    cfg = tmp_path / "my_det.yml"
    cfg.write_text("_BASE_: [base.yml]\nlog_iter: 5\n")
    return cfg


def test_the_launcher_knows_where_the_ranks_will_make_the_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    yolo = run_place(TRAIN, ["--data", "d.yaml", "--cfg", "yolov5n", "--weights", ""])
    assert (yolo.base, yolo.name, yolo.exist_ok) == (Path("runs/train"), "exp", False)
    assert yolo.where == "--project DIR (or --output DIR)"
    assert run_place(TRAIN, ["--data", "d.yaml", "--project", "p", "--name", "n", "--exist-ok"]).base == Path("p")
    cfg = str(_config(tmp_path, None))
    plain = run_place(TRAIN, ["-c", cfg, "--eval"])
    assert (plain.base, plain.name, plain.where) == (Path("output"), "my_det", "-o save_dir=DIR (or --output DIR)")
    assert run_place(TRAIN, ["-c", str(_config(tmp_path, "from_cfg"))]).base == Path("from_cfg")   # via _BASE_
    assert run_place(TRAIN, ["-c", cfg, "-o", "epoch=2", "save_dir=elsewhere"]).base == Path("elsewhere")
    given = run_place(str(REPO / "ppmulti" / "procs" / "train_command.py"), ["-c", cfg, "--output", "o/run"])
    assert (given.base, given.name, given.where) == (Path("o"), "run", "--output DIR")
    # nothing to check: a resume (its run exists), another script, flags the ranks will refuse themselves
    assert run_place(TRAIN, ["-c", cfg, "--resume", "output/my_det"]) is None
    assert run_place(str(tmp_path / "train.py"), ["-c", cfg]) is None
    assert run_place(TRAIN, ["-c", cfg, "--no-such-flag"]) is None


def _cli(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ppmulti.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120, env=launch_env())


def test_launch_refuses_a_file_named_runs_or_output_before_any_rank_starts(tmp_path):
    (tmp_path / "runs").write_text("")
    (tmp_path / "output").write_text("")
    yolo = _cli(["launch", "--nproc_per_node", "2", TRAIN, "--data", "d.yaml", "--cfg", "yolov5n", "--weights", "",
                 "--epochs", "1"], tmp_path)
    assert yolo.returncode == 2 and "Traceback" not in yolo.stderr
    assert yolo.stderr.strip() == ("error: runs is a file, so the run directory runs/train/exp cannot be made "
                                   "there: move or rename the file, or pick another place with --project DIR (or "
                                   "--output DIR)")
    plain = _cli(["launch", "--nproc_per_node", "2", TRAIN, "-c", str(DEMO_CONFIG), "--epochs", "1"], tmp_path)
    assert plain.returncode == 2 and "Traceback" not in plain.stderr
    assert plain.stderr.strip() == ("error: output is a file, so the run directory output/ppyoloe_demo cannot be "
                                    "made there: move or rename the file, or pick another place with "
                                    "-o save_dir=DIR (or --output DIR)")
    assert not (tmp_path / "log").exists()        # refused before Paddle's launcher started


@pytest.mark.slow
def test_one_process_refuses_a_file_named_output_in_one_line(small_demo, tmp_path):
    """``python tools/train.py -c CFG`` runs no launcher: the rank that makes the run directory says it."""
    (tmp_path / "output").write_text("")
    proc = subprocess.run([sys.executable, TRAIN, "-c", str(DEMO_CONFIG), "-o", *demo_overrides(small_demo, 64),
                           "--epochs", "1"], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env=launch_env())
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines()[-1] == (
        "error: output is a file, so the run directory output/ppyoloe_demo cannot be made there: move or rename the "
        "file, or pick another place with -o save_dir=DIR (or --output DIR)")


# ------------------------------------------------------------------------------------------------ the resume line
def test_resume_command_is_the_users_own_with_resume_at_its_end():
    assert resume_command(["python", "tools/train.py", "-c", "a b.yml", "--epochs", "9"], "out/x") == \
        "python tools/train.py -c 'a b.yml' --epochs 9 --resume out/x"
    assert resume_command(["ppmulti", "launch", "t.py", "--resume", "old", "--eval"], "r") == \
        "ppmulti launch t.py --eval --resume r"
    assert resume_command(["python", "t.py", "--resume", "--eval", "--resume=a", "-r", "b"], "r") == \
        "python t.py --eval --resume r"


def test_user_command_speaks_the_dialect_the_user_typed():
    launch = ["--nproc_per_node", "2", "tools/train.py", "-c", "c.yml"]
    assert user_command(launch, ["/venv/bin/ppmulti", "launch", *launch], {}) == ["ppmulti", "launch", *launch]
    assert user_command(launch, ["/repo/ppmulti/cli.py", "launch", *launch], {}) == ["ppmulti", "launch", *launch]
    relaunch = ["--nproc_per_node", "2", "--device", "cpu", "/repo/ppmulti/procs/train_command.py", "-c", "c.yml"]
    typed = ["tools/train.py", "-c", "c.yml", "--device", "cpu", "--nproc", "2"]
    assert user_command(relaunch, typed, {}) == ["python", *typed]     # train.py re-ran itself under the launcher
    assert user_command(relaunch, ["/venv/bin/ppmulti", "demo"], {}) == ["ppmulti", "launch", *relaunch]
    # a node of the ssh fan-out: the user's command (ppmulti launch --nodes ...) is on another machine
    assert user_command(launch, ["/repo/ppmulti/procs/launch/command.py", *launch],
                        {E.PPMULTI_NODES_JOB: "tag"}) is None


def test_one_process_names_its_own_command():
    from ppmulti.rank.engine.hooks.signals import own_command

    assert own_command(["tools/train.py", "--data", "d.yaml"]) == ["python", "tools/train.py", "--data", "d.yaml"]
    assert own_command(["/venv/bin/ppmulti", "demo"]) is None          # a subcommand without --resume
    assert own_command(["/repo/ppmulti/cli.py", "demo"]) is None


def test_rank_zero_reports_the_save_to_the_launcher_or_to_the_user(tmp_path, monkeypatch, caplog):
    from ppmulti.rank.engine.hooks.signals import Interruption, report

    stop = Interruption(signal.SIGTERM, epoch=1, step=2, checkpoint=Path("out/weights/last"))
    monkeypatch.delenv(E.PPMULTI_LAUNCH_DIR, raising=False)
    monkeypatch.setattr(sys, "argv", ["tools/train.py", "-c", "c.yml", "--output", "out"])
    with caplog.at_level("WARNING", logger="ppmulti"):
        report(stop, "SIGTERM", Path("out"), 6)                 # one process: its own command resumes
    assert caplog.messages[-1] == ("SIGTERM: stopped in epoch 2 after step 3/6; checkpoint out/weights/last.pdstate "
                                   "saved; resume with: python tools/train.py -c c.yml --output out --resume out")
    monkeypatch.setenv(E.PPMULTI_LAUNCH_DIR, str(tmp_path))      # under ppmulti launch: the launcher says it
    report(Interruption(signal.SIGINT, epoch=0, step=None, checkpoint=Path("out/weights/last")), "SIGINT",
           Path("out"), 6)
    assert json.loads((tmp_path / "interrupted.json").read_text()) == {
        "signal": "SIGINT", "where": "after epoch 1", "epoch": 1, "step": None,
        "checkpoint": "out/weights/last.pdstate", "run_dir": "out"}


def test_interruption_lines():
    record = {"signal": "SIGTERM", "where": "in epoch 2 after step 2/6", "epoch": 2, "step": 1,
              "checkpoint": "out/weights/last.pdstate", "run_dir": "out"}
    assert interruption_lines("SIGINT", record, "/abs/out", ["ppmulti", "launch", "t.py"]) == [
        "SIGINT: the ranks stopped in epoch 2 after step 2/6 and saved out/weights/last.pdstate",
        "resume with: ppmulti launch t.py --resume out"]
    assert interruption_lines("SIGTERM", None, "out", ["x.py"], checkpoint_exists=True) == [
        "SIGTERM: the ranks stopped before saving this epoch; out/weights/last.pdstate holds the last saved one",
        "resume with: x.py --resume out"]
    assert interruption_lines("SIGTERM", None, "out", ["x.py"]) == [
        "SIGTERM: the ranks stopped before any checkpoint of out was saved"]
    assert interruption_lines("SIGTERM", None, None, None) == ["SIGTERM: the ranks stopped"]
    assert interruption_lines("SIGTERM", record, "out", ["x"], node_rank=1) == [
        "SIGTERM: this node's ranks stopped; node 0 says what was saved and how to resume"]


# -------------------------------------------------------------------------------------------- real launches
@pytest.mark.slow
@pytest.mark.multiproc
def test_launch_beside_a_file_named_log_keeps_paddles_logs_next_to_it(launches, tmp_path):
    (tmp_path / "log").write_text("mine\n")
    proc = launches.start("--nproc_per_node", "2", ALLREDUCE, str(tmp_path / "out"))
    assert launches.wait(proc, 120) == 0, launches.output(proc)[-3000:]
    text = launches.output(proc)
    assert f"ppmulti launch: log is a file, so Paddle's logs go to {ALT_LOG_DIR}/ instead" in text, text[-2000:]
    assert "Traceback" not in text
    assert (tmp_path / "log").read_text() == "mine\n"
    assert (tmp_path / ALT_LOG_DIR / "workerlog.0").is_file() and (tmp_path / ALT_LOG_DIR / "launcher.log").is_file()


@pytest.mark.slow
@pytest.mark.multiproc
@pytest.mark.seam   # Paddle 2.6's and 3.3's launchers pass the signal on to the ranks each their own way
def test_sigterm_to_the_launcher_says_what_was_saved_and_the_command_resumes(launches, small_demo, tmp_path):
    out = tmp_path / "run"
    proc = launches.start("--nproc_per_node", "2", TRAIN, "-c", str(DEMO_CONFIG), "-o", *demo_overrides(small_demo, 64),
                          "snapshot_epoch=1", "--batch", "8", "--epochs", "20", "--output", "run")
    deadline = time.time() + 300
    while not (out / "weights" / "last.pdstate").is_file() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.1)
    assert proc.poll() is None, launches.output(proc)[-3000:]
    proc.send_signal(signal.SIGTERM)               # to ppmulti only, as a scheduler or `kill` would
    assert launches.wait(proc, 60) == 128 + signal.SIGTERM
    said = [line for line in launches.output(proc).splitlines() if line.startswith("ppmulti launch: ")]
    assert len(said) == 2, said
    stopped = re.fullmatch(r"ppmulti launch: SIGTERM: the ranks stopped (in epoch (\d+) after step \d+/6|after "
                           r"epoch (\d+)) and saved run/weights/last\.pdstate", said[0])
    assert stopped, said
    assert (out / "weights" / "last.pdstate").is_file()
    prefix = "ppmulti launch: resume with: ppmulti launch --nproc_per_node 2 "
    assert said[1].startswith(prefix) and said[1].endswith(" --output run --resume run"), said[1]
    # the printed command, as the user would paste it, finishes the interrupted epoch (or runs one more)
    epochs = int(stopped.group(2)) if stopped.group(2) else int(stopped.group(3)) + 1
    words = shlex.split(said[1][len("ppmulti launch: resume with: "):])
    resumed = subprocess.run([sys.executable, "-m", "ppmulti.cli", *words[1:], "--epochs", str(epochs)],
                             cwd=tmp_path, capture_output=True, text=True, timeout=300, env=launch_env())
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert json.loads((out / "metrics.json").read_text())["epochs"] == epochs
    rows = [line.split(",")[0] for line in (out / "results.csv").read_text().splitlines()[1:]]
    assert rows == [str(e) for e in range(1, epochs + 1)]
