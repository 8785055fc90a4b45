"""Resume decided once (engine.resume_plan): golden cases from the facts (Found) to the decision (ResumePlan), the
facts read from run directories as --resume names them, and the batch plan kept from the decision (issue 47, 3)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO, clean_env
from ppmulti.common.errors import UserError
from ppmulti.rank.engine.checkpoint import Progress, copy_checkpoint, read_progress, write_progress
from ppmulti.rank.engine.lr import Trained, plan_batch
from ppmulti.rank.engine.resume_plan import (NONE, PPDET, RESTART, RUN, Found, Located, ResumePlan, decide, locate,
                                             look, planned_epochs)

STATE = "/r/runs/train/exp/weights/last.pdstate"
DONE3 = {"epoch": 3, "global_step": 12, "world_size": 2, "global_batch": 8, "accumulate": 2, "step_in_epoch": 0}
MID = {**DONE3, "epoch": 1, "step_in_epoch": 2}   # stopped in epoch 2 of 3
EXT = ("extending /r/runs/train/exp from 3 to 5 epochs (3 done): the lr schedule is re-planned for 5 epochs",)

# (case, facts, epochs this start trains to, the decision)
GOLDEN = [
    ("nothing", Found(), 3, ResumePlan(NONE, epochs_wanted=3)),
    ("a finished run, the same epochs: kept as it is (the loop has nothing left, the run ends as before)",
     Found("/r/runs/train/exp", state_file=STATE, train=DONE3, planned=3), 3,
     ResumePlan(RUN, STATE, run_dir="/r/runs/train/exp", trained=Trained(8, 2, 2), epochs_done=3, epochs_planned=3,
                epochs_wanted=3)),
    ("a finished run, more epochs: extends, lr re-planned, said",
     Found("/r/runs/train/exp", state_file=STATE, train=DONE3, planned=3), 5,
     ResumePlan(RUN, STATE, run_dir="/r/runs/train/exp", trained=Trained(8, 2, 2), epochs_done=3, epochs_planned=3,
                epochs_wanted=5, extends=True, notes=EXT)),
    ("a stopped run resumed as planned",
     Found("/r/runs/train/exp", state_file=STATE, train=MID, planned=3), 3,
     ResumePlan(RUN, STATE, run_dir="/r/runs/train/exp", trained=Trained(8, 2, 2), epochs_done=1, epochs_planned=3,
                epochs_wanted=3)),
    ("a run of unknown plan (a Trainer from parts: no config.yml) never extends",
     Found("/r/runs/train/exp", state_file=STATE, train=DONE3), 5,
     ResumePlan(RUN, STATE, run_dir="/r/runs/train/exp", trained=Trained(8, 2, 2), epochs_done=3, epochs_wanted=5)),
    ("an old checkpoint without accumulate: 1",
     Found("/r/x", state_file=STATE, train={"epoch": 2, "global_step": 4, "world_size": 1, "global_batch": 4},
           planned=3), 3,
     ResumePlan(RUN, STATE, run_dir="/r/runs/train/exp", trained=Trained(4, 1, 1), epochs_done=2, epochs_planned=3,
                epochs_wanted=3)),
    ("a PaddleDetection stem: its own restore, a new run directory",
     Found("/p/output/cfg/3", ppdet_stem="/p/output/cfg/3"), 10,
     ResumePlan(PPDET, "/p/output/cfg/3", ppdet=True, epochs_wanted=10)),
    ("a launch restart after a crash, with a checkpoint: the recorded run wins over --resume",
     Found("/elsewhere", restart=2, restart_run="/r/runs/train/exp", restart_state=STATE, train=MID, planned=3), 3,
     ResumePlan(RESTART, STATE, run_dir="/r/runs/train/exp", trained=Trained(8, 2, 2), epochs_done=1,
                epochs_planned=3, epochs_wanted=3,
                notes=("launch restart 2: resuming /r/runs/train/exp from its last checkpoint",))),
    ("a launch restart before any checkpoint: the same directory again, fresh weights",
     Found(None, restart=1, restart_run="/r/runs/train/exp"), 3,
     ResumePlan(RESTART, run_dir="/r/runs/train/exp", epochs_wanted=3,
                notes=("launch restart 1: no checkpoint in /r/runs/train/exp yet, starting it again",))),
    ("a launch restart before any checkpoint of a run begun from PaddleDetection's: from it again",
     Found("/p/output/cfg/3", ppdet_stem="/p/output/cfg/3", restart=1, restart_run="/r/runs/train/exp"), 3,
     ResumePlan(RESTART, "/p/output/cfg/3", ppdet=True, run_dir="/r/runs/train/exp", epochs_wanted=3,
                notes=("launch restart 1: no checkpoint in /r/runs/train/exp yet, starting it again from "
                       "/p/output/cfg/3",))),
]


@pytest.mark.parametrize("case,found,wanted,expected", GOLDEN, ids=[g[0][:40] for g in GOLDEN])
def test_golden_decisions(case, found, wanted, expected):
    assert decide(found, wanted) == expected


@pytest.mark.parametrize("train,wanted,said", [
    (DONE3, 2, "the run has 3 epoch(s) done, but this start trains to 2 (--epochs / -o epoch=); give 3 or more"),
    (MID, 1, "the run has 1 epoch(s) done and the next under way, but this start trains to 1 (--epochs / -o "
             "epoch=); give 2 or more"),
])
def test_fewer_epochs_than_done_is_one_line(train, wanted, said):
    with pytest.raises(UserError) as err:
        decide(Found("runs/train/exp", state_file=STATE, train=train, planned=3), wanted)
    line = str(err.value)
    assert "\n" not in line and line.startswith("--resume runs/train/exp: ") and said in line, line


def _run(root: Path, name: str = "exp", epochs: int | None = 3) -> Path:
    run = root / "runs" / "train" / name
    (run / "weights").mkdir(parents=True)
    (run / "weights" / "last.pdstate").write_bytes(b"x")
    (run / "weights" / "last.pdparams").write_bytes(b"x")
    if epochs is not None:
        (run / "config.yml").write_text(f"architecture: YOLOv5\nepoch: {epochs}\nLearningRate:\n  base_lr: 0.01\n")
    return run


def test_bare_resume_locates_the_newest_run_and_its_config(tmp_path, monkeypatch):
    """A bare --resume: the newest weights/last under runs/train (or the user's --project/--name); the launching
    process takes that run's config.yml and opt.yaml."""
    old, new = _run(tmp_path, "exp"), _run(tmp_path, "exp2")
    os.utime(old / "weights" / "last.pdstate", (1, 1))
    monkeypatch.chdir(tmp_path)
    assert locate(True, None) == Located("runs/train/exp2", Path("runs/train/exp2"))
    assert locate(True, str(tmp_path / "runs" / "train" / "exp9")) == Located(str(new), new)
    assert locate(None, None) == Located(None) and locate(False, None) == Located(None)
    assert locate(str(new / "weights" / "last"), None) == Located(str(new / "weights" / "last"), new)
    with pytest.raises(UserError, match="no run with weights/last.pdstate under elsewhere"):
        locate(True, "elsewhere/exp")


@pytest.mark.parametrize("named", ["{run}", "{run}/weights/last", "{run}/weights/last.pdstate",
                                   "{run}/weights/last.pdparams"])
def test_resume_names_a_run_directory_or_its_last_checkpoint(tmp_path, named):
    run = _run(tmp_path, epochs=3)
    asked = named.format(run=run)
    found = look(asked, read_state=lambda path: {"train": dict(DONE3)})
    assert found == Found(asked, state_file=str(run / "weights" / "last.pdstate"), train=DONE3, planned=3)
    plan = decide(found, 4)
    assert (plan.source, plan.run_dir, plan.epochs_done, plan.extends) == (RUN, str(run), 3, True)


def test_resume_of_a_ppdet_stem_and_of_nothing(tmp_path):
    stem = tmp_path / "output" / "cfg" / "3"
    stem.parent.mkdir(parents=True)
    for suffix in (".pdparams", ".pdopt"):
        Path(f"{stem}{suffix}").write_bytes(b"x")
    assert look(str(stem) + ".pdparams") == Found(str(stem) + ".pdparams", ppdet_stem=str(stem))
    assert look(None) == Found() and look("") == Found()
    with pytest.raises(UserError, match="--resume .*: no training state found"):
        look(str(tmp_path / "nothing-here"))


def test_a_launch_restart_reads_the_run_its_first_start_recorded(tmp_path):
    from ppmulti.common.rundir import RUN_DIR_MARKER

    run = _run(tmp_path, epochs=3)
    launch = tmp_path / "launch"
    launch.mkdir()
    (launch / RUN_DIR_MARKER).write_text(f"{run}\n")
    state = str(run / "weights" / "last.pdstate")
    # the checkpoint's own record of its planned epochs wins over config.yml (which a start that extends rewrites
    # before its first checkpoint: a restart of it still extends from the checkpoint's 2)
    payload = {"train": dict(MID), "hooks": {"resume": {"epochs": 2}}}
    found = look("ignored/by/a/restart", restart=1, launch_dir=str(launch), read_state=lambda path: payload)
    assert found == Found("ignored/by/a/restart", restart=1, restart_run=str(run), restart_state=state, train=MID,
                          planned=2)
    assert decide(found, 3).extends
    first = look(str(run), restart=0, launch_dir=str(launch), read_state=lambda p: {"train": dict(MID)})
    assert first.restart_run is None and first.state_file == state
    (run / "weights" / "last.pdstate").unlink()
    assert look(None, restart=1, launch_dir=str(launch)) == Found(restart=1, restart_run=str(run))


def test_planned_epochs_is_the_run_configs_top_level_epoch(tmp_path):
    (tmp_path / "config.yml").write_text("LearningRate:\n  schedulers:\n  - max_epochs: 9\nepoch: 4\n")
    assert planned_epochs(tmp_path) == 4
    assert planned_epochs(tmp_path / "missing") is None


# --batch / ranks on resume: the batch plan keeps the decision's trained effective batch (lr.plan_batch's rules)
@pytest.mark.parametrize("world,batch,accumulate,expected", [
    (2, None, None, (8, 4, 2)),     # as trained: global 8 x accumulate 2
    (1, None, None, (4, 4, 4)),     # one rank: the per-rank batch kept, accumulate 4 keeps 16
    (2, 4, None, (4, 2, 4)),        # --batch 4 divides 16: accumulate 4
    (2, 16, None, (16, 8, 1)),      # --batch 16: no accumulation
    (2, 4, 1, (4, 2, 1)),           # --accumulate: the user's new plan (the lr rescales)
])
def test_the_batch_plan_keeps_the_resumed_effective_batch(world, batch, accumulate, expected):
    plan = decide(Found("r", state_file=STATE, train=DONE3, planned=3), 3)
    got = plan_batch(world, 99, batch=batch, accumulate=accumulate, nominal=64, trained=plan.trained)
    assert (got.global_batch, got.per_rank, got.accumulate) == expected


def test_batch_on_resume_that_does_not_divide_the_effective_batch_is_one_line():
    plan = decide(Found("r", state_file=STATE, train=DONE3, planned=3), 3)
    with pytest.raises(UserError, match="--resume with --batch 6: .* effective batch of 16 .* divides 16"):
        plan_batch(2, 4, batch=6, trained=plan.trained)


def test_best_is_a_hard_link_to_last_where_the_file_system_allows(tmp_path, monkeypatch):
    """copy_checkpoint publishes weights/best as a hard link to weights/last (no bytes written); where links
    fail (some network file systems) it copies. Either way the next last, renamed into place, leaves best's
    bytes as they were."""
    from ppmulti.common.atomic import atomic_save

    weights = tmp_path / "weights"
    weights.mkdir()
    for suffix, data in ((".pdparams", b"weights 1"), (".pdstate", b"state 1")):
        (weights / f"last{suffix}").write_bytes(data)
    copy_checkpoint(weights / "last", weights / "best")
    assert os.path.samefile(weights / "best.pdparams", weights / "last.pdparams")
    atomic_save(weights / "last.pdparams", lambda tmp: Path(tmp).write_bytes(b"weights 2"))
    assert (weights / "best.pdparams").read_bytes() == b"weights 1"

    def no_links(src, dst):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "link", no_links)
    copy_checkpoint(weights / "last", weights / "best")
    assert not os.path.samefile(weights / "best.pdparams", weights / "last.pdparams")
    assert (weights / "best.pdparams").read_bytes() == b"weights 2"
    assert (weights / "best.pdstate").read_bytes() == b"state 1"
    assert sorted(p.name for p in weights.iterdir()) == ["best.pdparams", "best.pdstate", "last.pdparams",
                                                         "last.pdstate"]   # no temp file left


# --resume with fewer epochs than done, refused by the launching process from the checkpoint's sidecar
# (weights/last.json), by the same rule and words as decide's in the rank

def test_the_sidecar_says_what_its_own_state_file_holds(tmp_path):
    run = _run(tmp_path)
    last = run / "weights" / "last"
    assert read_progress(f"{last}.pdstate") is None   # a run written before sidecars: the rank decides
    write_progress(last, Progress(3, False, 3))
    assert read_progress(f"{last}.pdstate") == read_progress(last) == Progress(3, False, 3)
    copy_checkpoint(last, run / "weights" / "best")   # the copy is another file: its own sidecar names it
    assert read_progress(run / "weights" / "best.pdstate") == Progress(3, False, 3)
    # a crash between a new state file (written as every checkpoint is: a temp file renamed onto it) and its
    # sidecar leaves the older sidecar: it names another file, ignored
    before = (run / "weights" / "best.pdstate").read_bytes()
    (run / "weights" / ".next").write_bytes(b"the next save")
    os.replace(run / "weights" / ".next", run / "weights" / "last.pdstate")
    assert read_progress(f"{last}.pdstate") is None
    # best, a hard link to the old last where the file system allows, keeps its bytes and its sidecar
    assert (run / "weights" / "best.pdstate").read_bytes() == before
    assert read_progress(run / "weights" / "best.pdstate") == Progress(3, False, 3)
    (run / "weights" / "best.json").write_text('{"epochs_done": 3')   # torn by hand (writes are atomic)
    assert read_progress(run / "weights" / "best.pdstate") is None


@pytest.mark.parametrize("progress,wanted", [(Progress(3, False, 3), 2), (Progress(1, True, 3), 1)])
def test_locate_refuses_fewer_epochs_than_done_in_decides_words(tmp_path, progress, wanted):
    run = _run(tmp_path)
    write_progress(run / "weights" / "last", progress)
    located = locate(str(run), None)
    assert located == Located(str(run), run, progress)
    train = {**DONE3, "epoch": progress.epochs_done, "step_in_epoch": 2 if progress.mid_epoch else 0}
    with pytest.raises(UserError) as early:
        located.check_epochs(wanted)
    with pytest.raises(UserError) as late:
        decide(Found(str(run), state_file=STATE, train=train, planned=3), wanted)
    assert str(early.value) == str(late.value)
    located.check_epochs(progress.epochs_done + progress.mid_epoch)   # enough: no word
    located.check_epochs(None)   # the config's epochs: the rank reads them


def test_epochs_wanted_is_epochs_else_the_last_o_epoch():
    from ppmulti.rank.entry import epochs_wanted

    assert epochs_wanted(4, ["epoch=9"]) == 4   # --epochs wins, as the builder applies it after -o
    assert epochs_wanted(None, ["epoch=9", "a.b=1", "epoch=2"]) == 2
    assert epochs_wanted(None, ["epoch=true"]) is None and epochs_wanted(None, []) is None


def test_the_launching_process_refuses_fewer_epochs_in_one_line_without_paddle(tmp_path):
    """tools/train.py and ``ppmulti launch`` on a run written here (no training): exit 2, one line, no log/ (no
    rank started), within a second or so; a `paddle` on PYTHONPATH that kills the process if imported proves
    the refusal imports none."""
    run = _run(tmp_path)
    (run / "weights" / "last.pdstate").write_bytes(b"never loaded")
    write_progress(run / "weights" / "last", Progress(3, False, 3))
    fake = tmp_path / "fake" / "paddle"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("import os\nos._exit(97)\n")
    env = clean_env()
    env["PYTHONPATH"] = f"{fake.parent}{os.pathsep}{env['PYTHONPATH']}"
    said = (f"error: --resume {run}: the run has 3 epoch(s) done, but this start trains to {{}} (--epochs / -o "
            f"epoch=); give 3 or more (more extends the run), or leave it out")
    (tmp_path / "base.yml").write_text("epoch: 2\n")   # a -c config whose _BASE_ sets fewer epochs than done
    (tmp_path / "mine.yml").write_text("_BASE_: [base.yml]\narchitecture: YOLOv3\n")
    for head, flags, wanted in [([], ["--epochs", "1"], 1),
                                (["-m", "ppmulti.cli", "launch", "--nproc_per_node", "2", "--device", "cpu"],
                                 ["-o", "epoch=2"], 2),
                                ([], ["-c", str(tmp_path / "mine.yml")], 2)]:
        started = time.monotonic()
        proc = subprocess.run([sys.executable, *head, str(REPO / "tools" / "train.py"), "--resume", str(run),
                               *flags], cwd=tmp_path, capture_output=True, text=True, timeout=60, env=env)
        took = time.monotonic() - started
        assert proc.returncode == 2 and took < 5, (took, proc.returncode, proc.stderr)
        assert proc.stderr.strip().splitlines() == [said.format(wanted)]
        assert not (tmp_path / "log").exists()
