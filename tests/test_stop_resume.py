"""A stop that stops and a resume that keeps everything: SIGINT/SIGTERM stop a run at the next step whatever its
loader workers, it saves mid-epoch, and a stopped and resumed seeded run keeps every epoch's row and ends with the
weights of an uninterrupted one (issue 45, items 2 and 3)."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import REPO
from launching import launch_env

from ppmulti.rank.engine.hooks import Hook

FIXTURES = REPO / "tests" / "fixtures"


# ----------------------------------------------------------------------------- the loop, from toy parts
def _toy(run_dir: Path, *hooks, resume: str | None = None, steps: int = 4, accumulate: int = 1):
    from toys import toy_trainer

    from ppmulti.rank.engine.hooks import CheckpointHook, ResultsHook, ResumeHook, StopOnSignalHook
    from ppmulti.rank.engine.lr import split_batch
    from ppmulti.rank.engine.trainer import RunPlan

    extra = [ResumeHook(RunPlan(config="toy.yml", resume=resume))] if resume else []
    trainer = toy_trainer(epochs=3, steps=steps, run_dir=run_dir,
                          hooks=[CheckpointHook(), ResultsHook(), StopOnSignalHook(), *hooks, *extra])
    if accumulate > 1:
        from ppmulti.rank.engine.lr import Accumulation

        trainer.batch = split_batch(2, 1, accumulate=accumulate)
        trainer.accumulation = Accumulation(accumulate, steps)
    return trainer


class _SignalAt(Hook):
    """Sends this process ``sig`` after step ``step`` of epoch ``epoch`` (before the stop vote, which runs last)."""

    priority = 50

    def __init__(self, epoch: int, step: int, sig: int):
        self.at, self.sig = (epoch, step), sig

    def after_step(self, trainer, epoch, step, *_):
        if (epoch, step) == self.at:
            os.kill(os.getpid(), self.sig)


def _rows(run_dir: Path) -> list[dict]:
    return list(csv.DictReader((run_dir / "results.csv").open()))


@pytest.mark.parametrize("accumulate", [1, 2], ids=["every-step", "accumulate-2"])
def test_a_toy_run_stopped_mid_epoch_and_resumed_ends_as_an_uninterrupted_one(tmp_path, accumulate):
    import paddle

    from ppmulti.rank.engine.checkpoint import read_progress
    from ppmulti.rank.engine.hooks import Interrupted

    whole = _toy(tmp_path / "whole", accumulate=accumulate)
    whole.train()
    stopped = _toy(tmp_path / "cut", _SignalAt(1, 2, signal.SIGINT), accumulate=accumulate)
    with pytest.raises(Interrupted) as exc:
        stopped.train()
    assert exc.value.signal_name == "SIGINT" and exc.value.code == 130     # named as what came, not SIGTERM
    state = paddle.load(str(tmp_path / "cut" / "weights" / "last.pdstate"))["train"]
    # stopped right after the signal's step (accumulating by 2: back to the last optimizer step, step 2 is redone)
    assert (state["epoch"], state["step_in_epoch"]) == (1, 3 if accumulate == 1 else 2)
    assert set(state["loss_sums"]) == {"loss", "loss_mse"}
    progress = read_progress(tmp_path / "cut" / "weights" / "last.pdstate")   # the sidecar a launch reads
    assert (progress.epochs_done, progress.mid_epoch) == (1, True), progress
    assert [r["epoch"] for r in _rows(tmp_path / "cut")] == ["1"]
    resumed = _toy(tmp_path / "cut", resume=str(tmp_path / "cut"), accumulate=accumulate)
    resumed.train()
    a, b = whole.model.state_dict(), resumed.model.state_dict()
    for key in a:
        np.testing.assert_array_equal(a[key].numpy(), b[key].numpy(), err_msg=key)
    # every epoch keeps its row; the interrupted one averages all its steps, as the uninterrupted run did
    assert [(r["epoch"], r["loss"], r["loss_mse"]) for r in _rows(tmp_path / "cut")] == \
        [(r["epoch"], r["loss"], r["loss_mse"]) for r in _rows(tmp_path / "whole")]


def test_a_stop_on_an_epochs_last_step_keeps_that_epochs_row_on_resume(tmp_path):
    """The stop lands after the epoch's last step but before its end: the resumed epoch has no step left, and its
    row still carries its loss (it read ``2,,0.005...`` before)."""
    whole = _toy(tmp_path / "whole")
    whole.train()
    with pytest.raises(SystemExit):
        _toy(tmp_path / "cut", _SignalAt(1, 3, signal.SIGTERM)).train()
    _toy(tmp_path / "cut", resume=str(tmp_path / "cut")).train()
    rows = _rows(tmp_path / "cut")
    assert [(r["epoch"], r["loss"]) for r in rows] == [(r["epoch"], r["loss"]) for r in _rows(tmp_path / "whole")]
    assert all(r["loss"] for r in rows)


def test_the_ranks_stop_on_the_signal_of_any_rank_and_name_sigint_first(monkeypatch):
    from ppmulti.rank import dist
    from ppmulti.rank.engine.hooks import StopOnSignalHook

    hook = StopOnSignalHook()
    monkeypatch.setattr(dist, "world_size", lambda: 2)
    sums = {"got": [0.0, 1.0]}
    monkeypatch.setattr(dist, "all_reduce_sum", lambda values: sums["got"])
    assert hook.agreed() == signal.SIGTERM      # another rank got SIGTERM, this one nothing yet
    sums["got"] = [1.0, 1.0]
    assert hook.agreed() == signal.SIGINT
    sums["got"] = [0.0, 0.0]
    assert hook.agreed() is None


def test_under_a_launch_the_ranks_name_the_launchers_signal(tmp_path, monkeypatch):
    from ppmulti.common import envvars as E
    from ppmulti.common.rundir import SIGNALLED
    from ppmulti.rank.engine.hooks.signals import launcher_signal

    monkeypatch.setenv(E.PPMULTI_LAUNCH_DIR, str(tmp_path))
    assert launcher_signal() is None
    (tmp_path / SIGNALLED).write_text("SIGINT\n")
    assert launcher_signal() == "SIGINT"


# ----------------------------------------------------------------------------- loader workers leave it to the rank
@pytest.mark.slow
def test_forked_loader_workers_leave_sigint_and_sigterm_to_the_rank(tmp_path):
    """A SIGTERM and a SIGINT to the rank's whole process group (a Ctrl-C on a terminal; Paddle's launcher stops a
    rank with killpg) reach the rank's handler only: its forked workers (Paddle's loader forks them through
    multiprocessing) are in a group of their own and keep running. A SIGTERM to a worker itself still ends it (the
    rank's terminate() at exit), and the rank's signal mask is as it was."""
    script = tmp_path / "fork.py"
    script.write_text(
        "import json, multiprocessing as mp, os, signal, sys, time\n"
        "from ppmulti.rank.data.feed import shield_workers\n"
        "got = []\n"
        "for s in (signal.SIGINT, signal.SIGTERM):\n"
        "    signal.signal(s, lambda n, f: got.append(n))\n"
        "shield_workers()\n"
        "def work(path, seconds):\n"
        "    signal.signal(signal.SIGTERM, signal.SIG_DFL); signal.signal(signal.SIGINT, signal.SIG_DFL)\n"
        "    time.sleep(seconds)\n"
        "    open(path, 'w').write('alive')\n"
        "ctx = mp.get_context('fork')\n"
        "child = ctx.Process(target=work, args=(sys.argv[1], 2), daemon=True)\n"
        "child.start()\n"
        "other = ctx.Process(target=work, args=(sys.argv[1] + '.other', 60), daemon=True)\n"
        "other.start()\n"
        "time.sleep(0.5)\n"
        "groups = [os.getpgid(child.pid), os.getpgid(0)]\n"
        "os.killpg(0, signal.SIGTERM); os.killpg(0, signal.SIGINT)\n"
        "other.terminate(); other.join(20)\n"
        "child.join(20)\n"
        "time.sleep(0.2)\n"
        "mine = signal.pthread_sigmask(signal.SIG_BLOCK, [])\n"
        "print(json.dumps({'got': got, 'child': child.exitcode, 'other': other.exitcode, 'groups': groups,\n"
        "                  'mine': sorted(mine)}))\n")
    proc = subprocess.run([sys.executable, str(script), str(tmp_path / "alive")], capture_output=True, text=True,
                          timeout=60, env=launch_env(), start_new_session=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert sorted(out["got"]) == sorted([signal.SIGINT, signal.SIGTERM])
    assert out["child"] == 0 and (tmp_path / "alive").read_text() == "alive"
    assert out["groups"][0] != out["groups"][1]
    assert out["other"] == -signal.SIGTERM     # terminate() still works
    assert out["mine"] == []     # the rank's own mask is back as it was


# ----------------------------------------------------------------------------- real YOLOv5n runs
@pytest.fixture(scope="module")
def yolo_set(tmp_path_factory) -> Path:
    from ppmulti.common.synthdata import generate

    root = tmp_path_factory.mktemp("stop_resume") / "data"
    generate(root, fmt="yolo", n_train=16, n_val=4, size=64, seed=3)
    return root


def _train_args(data: Path, project: Path, name: str, *extra: str) -> list[str]:
    return [sys.executable, str(REPO / "tools" / "train.py"), "--imgsz", "64", "--batch", "4", "--weights", "",
            "--cfg", "yolov5n", "--data", str(data / "data.yaml"), "--epochs", "3", "--device", "cpu", "--noval",
            "--noplots", "--seed", "3", "--workers", "2", "--project", str(project), "--name", name, "--exist-ok",
            *extra]


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    proc = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=600, env=launch_env())
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def _stop_after_first_epoch(args: list[str], cwd: Path, run: Path, sig: int, group: bool) -> tuple[int, float, str]:
    """Start ``args``; once epoch 1's row is written send ``sig`` (to the whole group, as a terminal's Ctrl-C
    does, when ``group``); (exit code, seconds from the signal to the exit, output)."""
    proc = subprocess.Popen(args, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=launch_env(), start_new_session=True)
    try:
        deadline = time.time() + 300
        results = run / "results.csv"
        while time.time() < deadline and proc.poll() is None:
            if results.is_file() and len(results.read_text().splitlines()) >= 2:
                break
            time.sleep(0.05)
        assert proc.poll() is None, proc.communicate()[0][-3000:]
        sent = time.time()
        if group:
            os.killpg(proc.pid, sig)
        else:
            proc.send_signal(sig)
        out, _ = proc.communicate(timeout=120)
        return proc.returncode, time.time() - sent, out
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _same_weights(a: Path, b: Path) -> None:
    import paddle

    wa, wb = paddle.load(str(a)), paddle.load(str(b))
    assert set(wa) == set(wb)
    for key in wa:
        np.testing.assert_array_equal(np.asarray(wa[key]), np.asarray(wb[key]), err_msg=key)


@pytest.mark.slow
@pytest.mark.parametrize("ranks", [1, pytest.param(2, marks=pytest.mark.multiproc)])
def test_a_seeded_yolo_run_stopped_and_resumed_ends_as_an_uninterrupted_one(yolo_set, tmp_path, ranks):
    """YOLOv5n, 64 px, 16 images, 3 epochs, 2 loader workers per rank. The stopped run: a Ctrl-C (SIGINT to the
    process group, workers included) on one process, a SIGTERM to the launcher on 2 ranks, sent as epoch 1's row
    appears. It stops at the next step, names its signal, saves mid-epoch; resumed, its weights and every row of
    results.csv are the uninterrupted run's."""
    import paddle

    project = tmp_path / "runs"
    extra = ["--nproc", "2"] if ranks == 2 else []
    _run(_train_args(yolo_set, project, "whole", *extra), tmp_path)
    cut = project / "cut"
    sig = signal.SIGINT if ranks == 1 else signal.SIGTERM
    code, took, out = _stop_after_first_epoch(_train_args(yolo_set, project, "cut", *extra), tmp_path, cut, sig,
                                              group=ranks == 1)
    name = signal.Signals(sig).name
    assert code == 128 + sig, out[-3000:]
    assert took < 30, (took, out[-2000:])       # a step or two, not the rest of the epoch (log_iter is 100)
    log = (cut / "train.log").read_text()
    assert f"{name}: stopped " in log and "DataLoader process" not in out + log, (out + log)[-3000:]
    state = paddle.load(str(cut / "weights" / "last.pdstate"))["train"]
    assert (state["epoch"], state["step_in_epoch"]) != (3, 0), state    # stopped before the end
    if ranks == 2:   # the launcher's line says what rank 0 did
        assert f"ppmulti launch: {name}: the ranks stopped" in out and "saved" in out, out[-3000:]
    _run(_train_args(yolo_set, project, "cut", *extra, "--resume", str(cut)), tmp_path)
    _same_weights(project / "whole" / "weights" / "last.pdparams", cut / "weights" / "last.pdparams")
    keys = ("epoch", "loss", "loss_box", "loss_obj", "loss_cls")
    whole_rows, cut_rows = _rows(project / "whole"), _rows(cut)
    assert [tuple(r[k] for k in keys) for r in cut_rows] == [tuple(r[k] for k in keys) for r in whole_rows]
