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

import pytest

from conftest import DEMO_CONFIG, REPO, LossStub, demo_overrides


class _Tty(io.StringIO):
    """A console that says it is a terminal."""

    def isatty(self) -> bool:
        return True


def _trainer(steps: int = 4) -> SimpleNamespace:
    return SimpleNamespace(cfg={"log_iter": 2, "epoch": 2}, steps_per_epoch=steps,
                           batch=SimpleNamespace(global_batch=8))


def _one_epoch(hook, trainer, epoch: int = 0) -> None:
    for step in range(trainer.steps_per_epoch):
        hook.after_step(trainer, epoch, step, {"loss": LossStub(1.5), "loss_cls": LossStub(0.25)}, 0.001, 0.01)
    hook.after_epoch(trainer, SimpleNamespace(epoch=epoch, seconds=1.0, images_per_s=32.0,
                                              losses={"loss": 1.5}, metrics=None))


@pytest.fixture()
def rank_log(tmp_path):
    """ppmulti's rank-0 logging (train.log + console), its console a StringIO: (train.log path, console)."""
    import logging

    from ppmulti.rank.ranklog import setup_rank_logging

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

    from ppmulti.rank.engine.hooks import ConsoleLogHook

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
    from ppmulti.rank.engine.hooks import ConsoleLogHook

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


def test_step_lines_give_the_data_wait_per_step_since_the_last_line(rank_log):
    """The loop passes the epoch's running total of data wait; a line shows the mean per step of its interval."""
    from ppmulti.rank.engine.hooks import ConsoleLogHook

    hook = ConsoleLogHook(stream=io.StringIO())
    trainer = _trainer()
    hook.before_train(trainer)
    for epoch, totals in ((0, (0.4, 0.402, 0.404, 0.406)), (1, (0.001, 0.002, 0.003, 0.004))):
        for step, total in enumerate(totals):
            hook.after_step(trainer, epoch, step, {"loss": LossStub(1.5)}, 0.001, total)
    waits = re.findall(r"step \d/4 .* data ([0-9.]+)s/step", rank_log[1].getvalue())
    assert waits == ["0.201", "0.002", "0.001", "0.001"]


def test_track_bar_on_terminal_lines_elsewhere_silent_off_rank0(rank_log, monkeypatch):
    train_log = rank_log[0]
    from ppmulti.rank import dist
    from ppmulti.rank.engine.progress import track

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


# --- under `ppmulti launch`: rank 0's stdout is Paddle's workerlog, which Paddle copies to the terminal ---

_RANK_SCRIPT = '''
import logging, sys, time
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from ppmulti.rank import dist
from ppmulti.rank.engine.hooks import ConsoleLogHook
from ppmulti.rank.engine.progress import track
from ppmulti.rank.ranklog import setup_rank_logging


class Loss:
    def numpy(self):
        return np.array([1.5], dtype=np.float32)


setup_rank_logging(Path(sys.argv[1]), dist.rank())
log = logging.getLogger("ppmulti")
log.info("before training")
trainer = SimpleNamespace(cfg={"log_iter": 2, "epoch": 2}, steps_per_epoch=4, batch=SimpleNamespace(global_batch=8))
hook = ConsoleLogHook()
hook.before_train(trainer)
for epoch in range(2):
    for step in range(4):
        time.sleep(0.2)
        hook.after_step(trainer, epoch, step, {"loss": Loss()}, 0.001, 0.01)
    print(f"a stray line from rank {dist.rank()}", flush=True)   # like pycocotools while evaluating
    for _ in track(range(6), "eval"):
        time.sleep(0.1)
    hook.after_epoch(trainer, SimpleNamespace(epoch=epoch, seconds=1.0, images_per_s=32.0,
                                              losses={"loss": 1.5}, metrics=None))
hook.after_train(trainer)
log.info("after training")
'''


def _screen(output: str) -> list[str]:
    """What a terminal shows after ``output``: carriage returns, newlines and cursor-up (tqdm's moves)."""
    lines, row, col = [[]], 0, 0
    for token in re.findall(r"\x1b\[\d*[A-Za-z]|.", output, flags=re.S):
        if token == "\r":
            col = 0
        elif token == "\n":
            row += 1
            col = 0
            if row == len(lines):
                lines.append([])
        elif token.startswith("\x1b["):
            if token.endswith("A"):
                row = max(0, row - int(token[2:-1] or 1))
            elif token.endswith("K"):
                del lines[row][col:]
        else:
            line = lines[row]
            line.extend(" " * (col - len(line)))
            line[col:col + 1] = [token]
            col += 1
    return ["".join(line).rstrip() for line in lines]


def _launch_argv(log_dir: Path, *script: str, detach: bool = False) -> list[str]:
    return [sys.executable, "-m", "ppmulti.cli", "launch", *(["--detach"] if detach else []), "--nproc_per_node", "2",
            "--log_dir", str(log_dir), *script]


@pytest.mark.slow
def test_launch_from_a_terminal_draws_rank0_bars_there_and_keeps_logs_clean(tmp_path):
    script = tmp_path / "ranks.py"
    script.write_text(_RANK_SCRIPT)
    code, shown = _run_in_pty(_launch_argv(tmp_path / "log", str(script), str(tmp_path / "run")),
                              cwd=tmp_path, timeout=120)
    assert code == 0, shown[-3000:]
    screen = _screen(shown)
    text = "\n".join(screen)
    for epoch in (1, 2):
        bars = [line for line in screen if line.startswith(f"epoch {epoch}/2: 100%|")]
        assert len(bars) == 1, text[-3000:]   # the final state of each epoch bar, on a line of its own
        assert re.search(r"\| 4/4 \[.*, [\d.]+ img/s lr=0\.001 loss=1\.500\]$", bars[0]), bars[0]
    # every figure once: the bar's postfix replaces the step lines, and what rank 0 logs during training is
    # written to the terminal by rank 0 itself, not a second time through Paddle's copy of workerlog.0
    for once in ("epoch 1 done in 1.0s", "epoch 2 done in 1.0s", "before training", "after training"):
        assert sum(once in line for line in screen) == 1, (once, text[-3000:])
    assert screen.count("a stray line from rank 0") == 2   # Paddle's copy, on a clean line of its own
    assert "step 2/4" not in shown and "rank 1" not in shown    # Paddle copies workerlog.0 only
    # no redraws in any log file; the step lines are in train.log; rank 1 never draws
    for log_file in (tmp_path / "log" / "workerlog.0", tmp_path / "log" / "workerlog.1",
                     tmp_path / "run" / "train.log", tmp_path / "run" / "logs" / "rank1.log"):
        assert "\r" not in log_file.read_text(), log_file
    assert "epoch 2/2 step 4/4 loss=1.5000" in (tmp_path / "run" / "train.log").read_text()
    assert "a stray line from rank 1" in (tmp_path / "log" / "workerlog.1").read_text()


@pytest.mark.slow
def test_launch_with_piped_output_prints_plain_lines(tmp_path):
    script = tmp_path / "ranks.py"
    script.write_text(_RANK_SCRIPT)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    # a terminal named by an outer launch (this one runs inside a rank, say): only ppmulti launch's own
    # stdout decides, so nothing may be drawn there
    master, slave = os.openpty()
    env["PPMULTI_CONSOLE_TTY"] = os.ttyname(slave)
    try:
        proc = subprocess.run(_launch_argv(tmp_path / "log", str(script), str(tmp_path / "run")), cwd=tmp_path,
                              env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)
        os.set_blocking(master, False)
        try:
            drawn = os.read(master, 65536)
        except BlockingIOError:
            drawn = b""
    finally:
        os.close(master)
        os.close(slave)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert drawn == b""
    shown = proc.stdout + proc.stderr
    assert "\r" not in shown
    assert "epoch 1/2 step 2/4 loss=1.5000" in proc.stdout and "eval 6/6" in proc.stdout
    assert proc.stdout.count("epoch 2 done in 1.0s") == 1
    assert "\r" not in (tmp_path / "log" / "workerlog.0").read_text()


def test_launcher_terminal_is_rank0_only_and_falls_back_to_lines(tmp_path, monkeypatch):
    from ppmulti.rank import dist
    from ppmulti.common import envvars as E
    from ppmulti.rank.engine import progress

    def fresh(path: str, rank: int = 0):
        monkeypatch.setenv(E.PPMULTI_CONSOLE_TTY, path)
        monkeypatch.setenv("PADDLE_TRAINER_ID", str(rank))
        monkeypatch.setenv("PADDLE_TRAINERS_NUM", "2")
        monkeypatch.setattr(progress, "_launcher_checked", False)
        monkeypatch.setattr(progress, "_launcher_terminal", None)
        monkeypatch.setattr(progress.sys, "stdout", io.StringIO())   # rank 0's stdout: the workerlog

    master, slave = os.openpty()
    try:
        fresh(os.ttyname(slave))
        stream = progress.bar_stream()
        assert stream is not None and stream.isatty() and progress.wants_bars()
        with progress.ConsoleBars() as bars:
            assert bars.stream is stream
        fresh(os.ttyname(slave), rank=1)
        monkeypatch.setattr(dist, "is_main", lambda: False)
        assert progress.bar_stream() is None                # other ranks never draw
        monkeypatch.undo()
    finally:
        os.close(master)
        os.close(slave)
    not_a_tty = tmp_path / "file"
    not_a_tty.write_text("")
    for path in (str(tmp_path / "gone"), str(not_a_tty)):   # cannot be opened / is not a terminal
        fresh(path)
        assert progress.bar_stream() is None and not progress.wants_bars()
    assert E.PPMULTI_CONSOLE_TTY not in E.clean_launcher_env({E.PPMULTI_CONSOLE_TTY: "/dev/pts/9"})


@pytest.mark.slow
def test_two_rank_training_started_from_a_terminal_shows_bars(small_demo, tmp_path):
    # --nproc 2 re-runs the training through ppmulti launch (in this process, on this terminal)
    out = tmp_path / "run"
    code, shown = _run_in_pty([sys.executable, str(REPO / "tools" / "train.py"), "-c", str(DEMO_CONFIG),
                               "-o", *demo_overrides(small_demo), "--epochs", "1", "--eval", "--device", "cpu",
                               "--nproc", "2", "--output", str(out)], cwd=tmp_path, timeout=600)
    assert code == 0, shown[-3000:]
    screen = _screen(shown)
    bars = [line for line in screen if line.startswith("epoch 1/1: 100%|")]
    assert len(bars) == 1 and re.search(r"3/3 \[.*, [\d.]+ img/s lr=[\d.e-]+ loss=[\d.]+ cls=", bars[0]), shown[-3000:]
    assert sum("epoch 1 done in" in line for line in screen) == 1     # once: not also through workerlog.0
    assert not re.search(r"step \d+/3 loss=", shown)                  # the bar replaces the step lines ...
    text = (out / "train.log").read_text()
    assert re.search(r"epoch 1/1 step 2/3 loss=", text) and "epoch 1/1 step 3/3" in text   # ... kept here
    logs = list((out.parent).rglob("workerlog.*")) + [out / "train.log", out / "logs" / "rank1.log"]
    assert len(logs) >= 4 and not [p for p in logs if "\r" in p.read_text()]


@pytest.mark.slow
def test_detached_launch_from_a_terminal_prints_plain_lines_to_its_log(tmp_path):
    # `ppmulti launch --detach` typed at a terminal: the launcher's output is the run's log file, not the
    # terminal, so rank 0 must neither draw on the terminal it came from nor put redraws into the log
    from ppmulti.common import envvars as E

    script = tmp_path / "ranks.py"
    script.write_text(_RANK_SCRIPT)
    home = tmp_path / "home"
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    env = {**os.environ, E.PPMULTI_HOME: str(home),
           "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)}
    try:
        code = subprocess.run(_launch_argv(tmp_path / "log", str(script), str(tmp_path / "run"), detach=True),
                              cwd=tmp_path, env=env, stdin=slave, stdout=slave, stderr=slave, timeout=60).returncode
        assert code == 0
        deadline = time.time() + 120
        while time.time() < deadline and not list(home.rglob("exit.json")):
            time.sleep(0.5)
        exits = list(home.rglob("exit.json"))
        assert exits and '"code": 0' in exits[0].read_text()
        os.set_blocking(master, False)
        shown = b""
        while True:
            try:
                chunk = os.read(master, 65536)
            except (BlockingIOError, OSError):
                break
            if not chunk:
                break
            shown += chunk
    finally:
        os.close(master)
        os.close(slave)
    assert b"started run" in shown and b"epoch" not in shown       # the id line only, nothing drawn
    text = "".join(p.read_text() for p in exits[0].parent.iterdir() if p.suffix == ".log")
    assert "epoch 1/2 step 2/4 loss=1.5000" in text and "eval 6/6" in text and "\r" not in text


def test_bars_are_taken_down_when_training_raises(rank_log):
    """A crash or Ctrl-C mid-epoch: Trainer.train's ``close`` gives the console handler back, no bar left open."""
    import logging

    from ppmulti.rank.engine.hooks import ConsoleLogHook, Hook
    from toys import toy_trainer

    hook = ConsoleLogHook(stream=_Tty())

    class Crash(Hook):   # after the console hook (50): its bar is open when the step raises
        def after_step(self, trainer, epoch, step, outputs, lr, data_time):
            assert hook.bar is not None
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        toy_trainer(epochs=2, steps=4, hooks=[hook, Crash()]).train()
    assert hook.bar is None and hook.bars is None
    logging.getLogger("ppmulti").info("after the crash")
    assert "after the crash" in rank_log[1].getvalue()   # the plain console handler is back
