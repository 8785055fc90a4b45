"""Places a user cannot write (issue 45): a --project, --output, -o save_dir or --log_dir under a directory that
refuses writes, and a working directory that does, are one line before any rank starts; and a -o number that is
not one (``-o TrainReader.batch_size=abc``) is one line in the launching process.

The tests run as root in CI, where a chmod'ed directory is still writable: the directory is made immutable with
``chattr +i`` (ext4 and most Linux filesystems; root gets EPERM), or chmod 555 for other users."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import DEMO_CONFIG, REPO
from launching import launch_env
from ppmulti.common.errors import UserError
from ppmulti.common.rundir import check_run_place, new_run_dir, unwritable
from ppmulti.procs.launch.runner import choose_log_dir

TRAIN = str(REPO / "tools" / "train.py")


@pytest.fixture
def locked(tmp_path):
    """A directory nobody running this test can write into (it can be read and entered)."""
    path = tmp_path / "locked"
    path.mkdir()
    (path / "inside").mkdir()   # made before the lock: stays writable
    if os.geteuid() == 0:
        if shutil.which("chattr") is None or subprocess.run(["chattr", "+i", str(path)],
                                                            capture_output=True).returncode != 0:
            pytest.skip("running as root and chattr +i does not work here: no directory root cannot write")
        undo = ["chattr", "-i", str(path)]
    else:
        path.chmod(0o555)
        undo = None
    try:
        yield path
    finally:
        if undo:
            subprocess.run(undo, check=True)
        else:
            path.chmod(0o755)


def test_the_probe_sees_what_root_cannot_write(locked, tmp_path):
    assert unwritable(locked / "runs" / "exp")[0] == locked
    assert unwritable(tmp_path / "fine" / "exp") == (None, "")
    assert list(tmp_path.iterdir()) == [locked]            # the probe leaves nothing behind
    with pytest.raises(OSError):                            # and the directory really refuses writes
        (locked / "x").mkdir()


def test_a_run_directory_under_an_unwritable_directory_is_one_line(locked):
    why = unwritable(locked)[1]
    assert why in ("Operation not permitted", "Permission denied")
    with pytest.raises(UserError) as exc:
        new_run_dir(locked / "runs", "exp", where="--project DIR (or --output DIR)")
    assert str(exc.value) == (f"cannot write in {locked} ({why}), so the run directory {locked}/runs/exp cannot be "
                              f"made there: pick a writable place with --project DIR (or --output DIR)")
    with pytest.raises(UserError, match=f"^cannot write in {locked} "):   # exist_ok: the run would be made in it
        check_run_place(locked, "exp", exist_ok=True)
    check_run_place(locked / "inside", "exp")   # a writable directory below it is fine (chattr +i is not inherited)


def test_an_unwritable_log_dir_or_working_directory_is_one_line(locked, monkeypatch):
    why = unwritable(locked)[1]
    with pytest.raises(UserError) as exc:
        choose_log_dir(str(locked / "logs"), "log")
    assert str(exc.value) == f"--log_dir {locked}/logs: cannot write in {locked} ({why}); pass another --log_dir DIR"
    monkeypatch.chdir(locked)
    with pytest.raises(UserError) as exc:
        choose_log_dir(None, "log")
    assert str(exc.value) == (f"cannot write in the working directory {locked} ({why}), where Paddle's launcher keeps "
                              f"its logs (log/): pass --log_dir DIR, or start from a directory you can write")


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=180,
                          env=launch_env())


def test_tools_and_launch_refuse_unwritable_places_before_any_rank_starts(locked, tmp_path):
    why = unwritable(locked)[1]
    data = ["--data", "d.yaml", "--cfg", "yolov5n", "--weights", "", "--epochs", "1"]
    cases = [
        # tools/train.py, one process: said before Paddle is imported (no rank, no run directory)
        (["tools/train.py", *data, "--project", str(locked / "runs")], REPO,
         f"error: cannot write in {locked} ({why}), so the run directory {locked}/runs/exp cannot be made there: "
         f"pick a writable place with --project DIR (or --output DIR)"),
        # tools/train.py on 2 ranks from a working directory it cannot write (runs/train/exp goes there)
        ([TRAIN, *data, "--device", "cpu", "--nproc", "2"], locked,
         f"error: cannot write in the working directory {locked} ({why}), so the run directory runs/train/exp "
         f"cannot be made there: pick a writable place with --project DIR (or --output DIR)"),
        # ppmulti launch with -o save_dir under it
        (["-m", "ppmulti.cli", "launch", "--nproc_per_node", "2", TRAIN, "-c", str(DEMO_CONFIG), "-o",
          f"save_dir={locked}/out"], tmp_path,
         f"error: cannot write in {locked} ({why}), so the run directory {locked}/out/ppyoloe_demo cannot be made "
         f"there: pick a writable place with -o save_dir=DIR (or --output DIR)"),
        # ppmulti launch from an unwritable working directory, the run itself elsewhere: Paddle's log/ is refused
        (["-m", "ppmulti.cli", "launch", "--nproc_per_node", "2", TRAIN, *data, "--project", str(tmp_path / "r")],
         locked,
         f"error: cannot write in the working directory {locked} ({why}), where Paddle's launcher keeps its logs "
         f"(log/): pass --log_dir DIR, or start from a directory you can write"),
    ]
    for args, cwd, line in cases:
        proc = _run(args, cwd)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, (args, proc.stderr[-2000:])
        assert proc.stderr.strip().splitlines()[-1] == line, (args, proc.stderr[-2000:])
        assert "rank" not in proc.stderr.lower(), proc.stderr   # no rank was started
    assert not (tmp_path / "r").exists() and sorted(p.name for p in locked.iterdir()) == ["inside"]


# ------------------------------------------------------------------------------------ -o values that are not numbers
@pytest.mark.parametrize("item, line", [
    ("TrainReader.batch_size=abc", "-o TrainReader.batch_size=abc: expected a whole number of images per rank in a "
                                   "training batch, 1 or more, e.g. -o TrainReader.batch_size=8"),
    ("TrainReader.batch_size=0", "-o TrainReader.batch_size=0: expected a whole number of images per rank in a "
                                 "training batch, 1 or more, e.g. -o TrainReader.batch_size=8"),
    ("TrainReader.batch_size=2.5", "-o TrainReader.batch_size=2.5: expected a whole number"),
    ("epoch=true", "-o epoch=True: expected a whole number of epochs, 1 or more, e.g. -o epoch=8"),
    ("worker_num=-1", "-o worker_num=-1: expected a whole number of data loader workers per rank, 0 or more"),
    ("LearningRate.base_lr=fast", "-o LearningRate.base_lr=fast: expected a number above 0 (the learning rate), "
                                  "e.g. -o LearningRate.base_lr=0.01"),
])
def test_a_number_that_is_not_one_is_named_with_what_is_expected(item, line):
    from ppmulti.common.flags import parse_overrides
    from ppmulti.common.numbers import check_number_items, check_numbers

    with pytest.raises(UserError) as exc:
        check_numbers(parse_overrides([item]))
    assert str(exc.value).startswith(line)
    with pytest.raises(UserError) as exc:   # the launcher's check, on the raw items
        check_number_items([item])
    assert str(exc.value).startswith(line)
    check_numbers(parse_overrides(["TrainReader.batch_size=4", "epoch=3", "worker_num=0",
                                   "LearningRate.base_lr=0.001", "TrainDataset.dataset_dir=abc"]))   # fine


def test_batch_size_abc_is_one_line_before_ranks_start(tmp_path):
    for args in ([TRAIN], [TRAIN, "--device", "cpu", "--nproc", "2"],
                 ["-m", "ppmulti.cli", "launch", "--nproc_per_node", "2", TRAIN]):
        proc = _run([*args, "-c", str(DEMO_CONFIG), "-o", "TrainReader.batch_size=abc"], tmp_path)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
        assert proc.stderr.strip() == ("error: -o TrainReader.batch_size=abc: expected a whole number of images per "
                                       "rank in a training batch, 1 or more, e.g. -o TrainReader.batch_size=8")
        assert not (tmp_path / "output").exists()   # refused before a rank made its run directory
