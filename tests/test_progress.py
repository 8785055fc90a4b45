"""Console progress: tqdm bars on a rank-0 terminal (figures in the postfix, step lines to train.log only),
plain per-interval lines everywhere else; and a real training run under a pseudo-terminal."""

from __future__ import annotations

import errno
import fcntl
import io
import os
import re
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from conftest import DEMO_CONFIG, REPO, demo_overrides


class _Tty(io.StringIO):
    """A console that says it is a terminal."""

    def isatty(self) -> bool:
        return True


class _Loss:
    def __init__(self, value: float):
        self.value = value

    def numpy(self):
        return np.array([self.value], dtype=np.float32)


def _trainer(steps: int = 4) -> SimpleNamespace:
    return SimpleNamespace(cfg={"log_iter": 2, "epoch": 2}, steps_per_epoch=steps,
                           batch=SimpleNamespace(global_batch=8))


def _one_epoch(hook, trainer, epoch: int = 0) -> None:
    for step in range(trainer.steps_per_epoch):
        hook.after_step(trainer, epoch, step, {"loss": _Loss(1.5), "loss_cls": _Loss(0.25)}, 0.001, 0.01)
    hook.after_epoch(trainer, SimpleNamespace(epoch=epoch, seconds=1.0, images_per_s=32.0,
                                              losses={"loss": 1.5}, metrics=None))


@pytest.fixture()
def rank_log(tmp_path):
    """ppmulti's rank-0 logging (train.log + console), its console a StringIO: (train.log path, console)."""
    import logging

    from ppmulti.logs import setup_rank_logging

    log = setup_rank_logging(tmp_path, 0)
    console = io.StringIO()
    for handler in log.handlers:
        if type(handler) is logging.StreamHandler:
            handler.setStream(console)
    yield tmp_path / "train.log", console
    for handler in list(log.handlers):
        log.removeHandler(handler)
        handler.close()


def test_terminal_gets_a_bar_and_train_log_keeps_the_lines(rank_log):
    import logging

    from ppmulti.engine.hooks import ConsoleLogHook

    tty = _Tty()
    hook = ConsoleLogHook(stream=tty)
    trainer = _trainer()
    hook.before_train(trainer)
    _one_epoch(hook, trainer)
    logging.getLogger("ppmulti").warning("a warning while training")
    _one_epoch(hook, trainer, epoch=1)
    hook.after_train(trainer)
    logging.getLogger("ppmulti").info("after training")

    shown = tty.getvalue()
    assert "\r" in shown and "epoch 1/2" in shown and "epoch 2/2" in shown
    assert re.search(r"4/4 \[.*, [\d.]+ img/s lr=0\.001 loss=1\.500 cls=0\.250\]", shown), shown
    assert "step 2/4" not in shown                         # the bar replaces the per-interval lines
    assert "epoch 1 done in 1.0s" in shown and "a warning while training" in shown
    text = rank_log[0].read_text()
    for epoch in (1, 2):
        for step in (2, 4):
            assert f"epoch {epoch}/2 step {step}/4 loss=1.5000 loss_cls=0.2500 lr=0.001" in text
    assert "\r" not in text
    console = rank_log[1].getvalue()
    assert "step 2/4" not in console and "after training" in console   # the console handler is back


def test_not_a_terminal_prints_plain_lines(rank_log):
    from ppmulti.engine.hooks import ConsoleLogHook

    pipe = io.StringIO()
    hook = ConsoleLogHook(stream=pipe)
    trainer = _trainer()
    hook.before_train(trainer)
    _one_epoch(hook, trainer)
    hook.after_train(trainer)
    console = rank_log[1].getvalue()
    assert pipe.getvalue() == ""
    assert "\r" not in console
    assert "epoch 1/2 step 2/4 loss=1.5000" in console and "epoch 1/2 step 4/4" in console
    assert "epoch 1/2 step 2/4" in rank_log[0].read_text()


def test_track_bar_on_terminal_lines_elsewhere_silent_off_rank0(rank_log, monkeypatch):
    train_log = rank_log[0]
    from ppmulti import dist
    from ppmulti.engine.progress import track

    tty = _Tty()
    assert list(track(range(25), "eval", stream=tty)) == list(range(25))
    shown = tty.getvalue()
    assert shown.startswith("\reval:") and "/25 [" in shown   # drawn, then cleared (leave=False) ...
    assert shown.endswith("\r") and "\n" not in shown          # ... so the epoch line stays on top
    assert "eval " not in train_log.read_text()

    assert list(track(range(25), "eval", stream=io.StringIO())) == list(range(25))
    lines = re.findall(r"INFO eval (\d+)/25", train_log.read_text())
    assert lines == ["3", "6", "9", "12", "15", "18", "21", "24", "25"]   # about ten lines, and the last

    monkeypatch.setattr(dist, "is_main", lambda: False)
    before = train_log.read_text()
    tty = _Tty()
    assert list(track(range(5), "eval", stream=tty)) == list(range(5))
    assert tty.getvalue() == "" and train_log.read_text() == before


def _run_in_pty(args: list[str], cwd: Path, timeout: float) -> tuple[int, str]:
    """Run ``args`` with stdin/stdout/stderr on a 120x40 pseudo-terminal; return (exit code, output)."""
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    proc = subprocess.Popen(args, cwd=cwd, env=env, stdin=slave, stdout=slave, stderr=slave, close_fds=True)
    os.close(slave)
    chunks = []
    deadline = time.time() + timeout
    try:
        while time.time() < deadline:
            try:
                data = os.read(master, 65536)
            except OSError as exc:   # EIO: every writer closed the terminal
                if exc.errno != errno.EIO:
                    raise
                break
            if not data:
                break
            chunks.append(data)
        code = proc.wait(timeout=max(1.0, deadline - time.time()))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)
    return code, b"".join(chunks).decode(errors="replace")


@pytest.mark.slow
def test_training_on_a_terminal_shows_bars(small_demo, tmp_path):
    out = tmp_path / "run"
    code, shown = _run_in_pty([sys.executable, str(REPO / "tools" / "train.py"), "-c", str(DEMO_CONFIG),
                               "-o", *demo_overrides(small_demo), "--epochs", "1", "--eval",
                               "--output", str(out)], cwd=tmp_path, timeout=600)
    assert code == 0, shown[-3000:]
    assert "\r" in shown
    assert re.search(r"epoch 1/1: +100%.*6/6 \[.*, [\d.]+ img/s lr=[\d.e-]+ loss=[\d.]+ cls=", shown), shown[-3000:]
    assert re.search(r"eval: ", shown), shown[-3000:]        # the evaluation bar
    assert not re.search(r"step \d+/6 loss=", shown)          # no per-interval lines on the terminal ...
    text = (out / "train.log").read_text()
    assert re.search(r"epoch 1/1 step 2/6 loss=", text) and "epoch 1/1 step 6/6" in text   # ... but in the log
    assert "epoch 1 done in" in shown and "\r" not in text
