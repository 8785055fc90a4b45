"""Evolution as commands: slot planning, the generation budget of one Optuna study across processes, and real CPU
evolutions (SQLite study by default, resumed, stopped and resumed)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from conftest import one_line_error
from ppmulti.common import envvars as E
from ppmulti.common.errors import UserError
from ppmulti.procs.runs import evolve_study as S
from ppmulti.procs.runs.evolve import EvolveStore
from ppmulti.procs.runs.evolve_run import Slot, _strip, mutated_bounds, plan_slots

REPO = Path(__file__).resolve().parents[1]


def _cli(args: list[str], cwd: Path, timeout: float = 600, env: dict | None = None):
    full = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    full.update(env or {})
    return subprocess.run([sys.executable, "-m", "ppmulti.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env=full)


# ----------------------------------------------------------------------------- pure planning
def test_plan_slots_cpu_workers_share_the_cores():
    slots = plan_slots("cpu", workers=2, cores=2, environ={})
    assert slots == [Slot("cpu#0", ("--device", "cpu"), ((E.PPMULTI_CPU_THREADS, "1"),)),
                     Slot("cpu#1", ("--device", "cpu"), ((E.PPMULTI_CPU_THREADS, "1"),))]
    assert plan_slots("cpu", cores=8, environ={})[0].env == ((E.PPMULTI_CPU_THREADS, "8"),)
    assert plan_slots("cpu", workers=3, cores=8, environ={E.PPMULTI_CPU_THREADS: "2"})[0].env == ()


def test_plan_slots_gpus_groups_and_per_device():
    assert [s.device_args for s in plan_slots("0,1,2,3")] == [("--device", str(i)) for i in range(4)]
    assert [s.device_args for s in plan_slots("0,1,2,3", group=2)] == [("--device", "0,1"), ("--device", "2,3")]
    two = plan_slots("0,1", per_device=2)
    assert [s.label for s in two] == ["gpu0#0", "gpu0#1", "gpu1#0", "gpu1#1"]
    assert [s.device_args for s in two] == [("--device", "0")] * 2 + [("--device", "1")] * 2


@pytest.mark.parametrize("kwargs, needle", [
    ({"devices": "0,1,2", "group": 2}, "does not divide"),
    ({"devices": "0,0"}, "distinct"),
    ({"devices": "gpu"}, "expected cpu or GPU ids"),
    ({"devices": "0,1", "workers": 2}, "--workers counts CPU workers"),
    ({"devices": "cpu", "workers": 0}, "--workers 0"),
    ({"devices": "cpu", "per_device": 0}, "--per-device 0"),
])
def test_plan_slots_bad_input(kwargs, needle):
    with pytest.raises(UserError, match=needle.replace("(", r"\(")):
        plan_slots(**kwargs)


def test_strip_takes_flags_apart():
    argv = ["--cfg", "yolov5n", "--evolve", "--hyp", "h.yaml", "--project=p", "--exist-ok", "--name", "x",
            "--img", "64"]
    stripped = _strip(argv, {"--hyp", "--project", "--name"}, {"--exist-ok"}, {"--evolve"})
    assert stripped == ["--cfg", "yolov5n", "--img", "64"]
    assert _strip(["--evolve", "5", "--img", "64"], set(), set(), {"--evolve"}) == ["--img", "64"]


def test_only_hyps_that_act_here_are_mutated():
    bounds = mutated_bounds()
    assert {"lr0", "mosaic", "warmup_bias_lr", "warmup_momentum"} <= set(bounds)
    assert not {"flipud", "copy_paste", "perspective"} & set(bounds)


# ----------------------------------------------------------------------------- bad input, one line each
@pytest.mark.parametrize("args, needle", [
    (["--generations", "2", "--", "--cfg", "yolov5n", "--device", "0"], "--device in the training's flags"),
    (["--generations", "2", "--", "--cfg", "yolov5n", "--project", "x"], "--project in the training's flags"),
    (["--generations", "2", "--", "--cfg", "yolov5n", "--quad"], "--quad"),
    (["--generations", "2"], "no training given"),
    (["--generations", "0", "--", "--cfg", "yolov5n"], "--generations 0"),
    (["--generations", "2", "--devices", "0,1", "--workers", "2", "--", "--cfg", "yolov5n"], "--workers"),
    (["--generations", "2", "--", "--cfg", "yolov5n", "--hyp", "nope.yaml"], "nope.yaml"),
    (["--generations", "2", "--", "--cfg", "yolov5n", "--storage", "sqlite:///x.db"], "--storage in the training"),
    (["--", "--cfg", "yolov5n"], "--generations N is required"),
    (["--generations", "1", "--storage", "nonsense", "--", "--cfg", "yolov5n"], "--storage nonsense: not a database"),
    (["--generations", "1", "--detach", "--storage", "postgresql://u:pw-secret-9@h/db", "--", "--cfg", "yolov5n"],
     "--storage with a password and --detach"),
    (["--dashboard", "--project", "nowhere"], "no evolve.db in"),
])
def test_evolve_bad_input_is_one_line(tmp_path, args, needle):
    proc = _cli(["evolve", *args], tmp_path)
    one_line_error(proc, needle)
    assert "pw-secret-9" not in proc.stdout + proc.stderr


def test_other_hyp_set_in_the_same_project_is_refused(tmp_path):
    storage = S.open_storage(S.default_storage(tmp_path))
    S.open_study(storage, tmp_path.name, None, {"lr0": 0.01}, "test")
    proc = _cli(["evolve", "--generations", "2", "--project", str(tmp_path), "--", "--cfg", "yolov5n"], tmp_path)
    one_line_error(proc, "evolves other hyperparameters")


# ----------------------------------------------------------------------------- the budget across processes
_FAKE_WORKERS = """
import json, sys, time
from pathlib import Path
from ppmulti.procs.runs.evolve_run import Evolution, EvolveSpec, Slot

class Fake(Evolution):
    def train(self, job, slot):                  # a 'training' that writes metrics.json like the real one
        job.directory.mkdir(parents=True, exist_ok=True)
        time.sleep(0.01)
        m = {"mAP50": round(0.5 * job.hyp["lr0"] * 10, 6), "mAP50_95": round(0.3 * job.hyp["lr0"] * 10, 6)}
        (job.directory / "metrics.json").write_text(json.dumps(m))
        return 0
    def _write_outputs(self, plot=False):        # evolve.csv and hyp_evolve.yaml; evolve.png is tested elsewhere
        return super()._write_outputs(plot=False)

project, go = Path(sys.argv[1]), Path(sys.argv[2])
base = {"lr0": 0.01, "momentum": 0.9, "box": 0.05, "iou_t": 0.2}
spec = EvolveSpec(project=project, generations=int(sys.argv[3]), train_args=(), base_hyp=base,
                  slots=(Slot("a", ()), Slot("b", ())), seed=0, heartbeat=2)   # two workers, as --workers 2
while not go.exists():
    time.sleep(0.01)
sys.exit(Fake(spec).run())
"""


@pytest.mark.slow
@pytest.mark.multiproc
def test_generation_budget_holds_across_processes(tmp_path):
    """3 processes x 2 worker threads ask one SQLite study at once: exactly N finished trials."""
    import optuna
    from optuna.trial import TrialState

    generations = 10
    go = tmp_path / "go"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    procs = [subprocess.Popen([sys.executable, "-c", _FAKE_WORKERS, str(tmp_path / "evo"), str(go), str(generations)],
                              env=env, stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True) for _ in range(3)]
    time.sleep(1.0)
    go.touch()
    for p in procs:
        out, err = p.communicate(timeout=180)
        assert p.returncode == 0, out + err
        assert f"{generations}/{generations} generations; best fitness" in out
    study = optuna.load_study(study_name="evo", storage=S.default_storage(tmp_path / "evo"))
    done = study.get_trials(states=(TrialState.COMPLETE,))
    assert len(done) == generations
    others = [t for t in study.trials if t.state != TrialState.COMPLETE]
    # a trial asked at the same moment as another over the budget is failed before it gets hyps
    assert all(t.state == TrialState.FAIL and not t.params and S.SKIPPED_ATTR in t.user_attrs for t in others)
    assert len(EvolveStore(tmp_path / "evo" / "evolve.csv").rows()) == generations
    assert done[0].number == 0 and done[0].params == {"lr0": 0.01, "momentum": 0.9, "box": 0.05, "iou_t": 0.2}
    bounds = mutated_bounds()
    for t in done[1:]:
        directory = tmp_path / "evo" / "candidates" / f"{t.number:04d}"
        parent = yaml.safe_load((directory / "parent.yaml").read_text())
        child = yaml.safe_load((directory / "hyp.yaml").read_text())
        assert child == t.params and child != parent
        assert all(bounds[k][1] <= child[k] <= bounds[k][2] for k in child if k in bounds)


# ----------------------------------------------------------------------------- real evolutions on CPU
@pytest.fixture(scope="module")
def tiny_yolo(tmp_path_factory) -> Path:
    from ppmulti.common.synthdata import generate

    root = tmp_path_factory.mktemp("evo_data") / "demo"
    generate(root, fmt="yolo", n_train=16, n_val=8, size=96, seed=5)
    return root


def _train_args(data: Path, epochs: int = 1) -> list[str]:
    return ["--data", str(data / "data.yaml"), "--cfg", "yolov5n", "--weights", "", "--img", "64", "--epochs",
            str(epochs), "--batch", "8", "--optimizer", "AdamW", "--workers", "0"]


@pytest.mark.slow
@pytest.mark.multiproc
def test_evolve_on_cpu_two_workers_resumes_stops_and_resumes_a_candidate(tmp_path, tiny_yolo):
    import optuna

    project = tmp_path / "evo"
    def cmd_for(generations: int, epochs: int = 1) -> list[str]:
        return ["evolve", "--devices", "cpu", "--workers", "2", "--generations", str(generations), "--project",
                str(project), "--", *_train_args(tiny_yolo, epochs)]

    cmd = cmd_for(2)
    t = time.time()
    first = _cli(cmd, tmp_path)
    seconds = time.time() - t
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    store = EvolveStore(project / "evolve.csv")
    rows = store.rows()
    assert len(rows) == 2
    assert "cpu#0" in first.stdout and "cpu#1" in first.stdout      # both workers trained candidates
    best = yaml.safe_load((project / "hyp_evolve.yaml").read_text())
    assert set(best) == set(yaml.safe_load((REPO / "configs/hyps/hyp.scratch-low.yaml").read_text()))
    assert (project / "evolve.png").read_bytes().startswith(b"\x89PNG")
    # the first generation is the base hyp; the others were bred from recorded rows and mutated within bounds
    cands = sorted((project / "candidates").iterdir())
    assert [c.name for c in cands] == ["0000", "0001"]
    assert not (cands[0] / "parent.yaml").exists()
    bounds = mutated_bounds()
    for c in cands[1:]:
        parent = yaml.safe_load((c / "parent.yaml").read_text())
        child = yaml.safe_load((c / "hyp.yaml").read_text())
        changed = [k for k in child if child[k] != parent[k]]
        assert changed and set(changed) <= set(bounds)
        assert all(bounds[k][1] <= child[k] <= bounds[k][2] for k in changed)
        assert not list((c / "weights").glob("*.pdstate")) and (c / "weights" / "last.pdparams").is_file()
    print(f"evolve 2 generations, 2 CPU workers: {seconds:.1f}s")

    # the same command again: complete, nothing trained
    again = _cli(cmd, tmp_path)
    assert again.returncode == 0, again.stderr[-2000:]
    assert "training candidate" not in again.stdout and len(store.rows()) == 2

    # one more generation, stopped (SIGTERM) after its candidate's first epoch: checkpointed, its trial queued again
    more = [sys.executable, "-m", "ppmulti.cli", *cmd_for(3, epochs=3)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen(more, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    results = project / "candidates" / "0002" / "results.csv"
    deadline = time.time() + 180
    while time.time() < deadline and not (results.is_file() and len(results.read_text().splitlines()) >= 2):
        time.sleep(0.2)
    proc.terminate()
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + 15, out + err
    assert "2/3 generations finished in study 'evo'" in out and "SIGTERM: stopping 1 candidate" in err
    assert (project / "candidates" / "0002" / "weights" / "last.pdstate").is_file() and len(store.rows()) == 2
    trials = optuna.load_study(study_name="evo", storage=S.default_storage(project)).trials
    # (the second worker may have asked at the same moment and yielded: a failed trial without hyps)
    trials = [t for t in trials[2:] if t.params]
    assert [(t.number, t.state.name) for t in trials] == [(2, "FAIL"), (trials[1].number, "WAITING")]
    assert trials[1].system_attrs["failed_trial"] == 2 and trials[1].params == trials[0].params

    # the same command resumes that candidate from its checkpoint, as the queued trial
    resumed = subprocess.run(more, cwd=tmp_path, capture_output=True, text=True, timeout=600, env=env)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert f"resuming candidate 2 (trial {trials[1].number})" in resumed.stdout
    assert resumed.stdout.count("candidate 2") == 2
    assert "resumed from" in (project / "candidates" / "0002" / "console.log").read_text()
    assert len(results.read_text().splitlines()) == 1 + 3
    assert len(store.rows()) == 3 and (project / "candidates" / "0002" / "parent.yaml").is_file()


@pytest.mark.slow
@pytest.mark.multiproc
def test_train_py_evolve_one_worker(tmp_path, tiny_yolo):
    import optuna

    db = tmp_path / "studies" / "all.db"
    proc = subprocess.run([sys.executable, str(REPO / "tools/train.py"), *_train_args(tiny_yolo), "--device", "cpu",
                           "--evolve", "1", "--project", str(tmp_path / "runs"), "--name", "ev",
                           "--storage", f"sqlite:///{db}"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    project = tmp_path / "runs" / "ev"
    assert len(EvolveStore(project / "evolve.csv").rows()) == 1
    assert (project / "hyp_evolve.yaml").is_file() and (project / "evolve.png").is_file()
    assert not (project / "evolve.db").exists()
    assert len(optuna.load_study(study_name="ev", storage=f"sqlite:///{db}").trials) == 1
    console = (project / "candidates" / "0000" / "console.log").read_text()
    assert "--device cpu" in console and "--hyp" in console and "--evolve" not in console.splitlines()[0]
    assert "--storage" not in console.splitlines()[0]


def test_a_directory_of_another_candidate_is_moved_aside(tmp_path):
    from ppmulti.procs.runs.evolve_run import move_foreign

    directory = tmp_path / "candidates" / "0000"
    (directory / "weights").mkdir(parents=True)
    (directory / "hyp.yaml").write_text("lr0: 0.05\n")               # left by a study since removed
    (directory / "weights" / "last.pdstate").write_bytes(b"x")
    aside = move_foreign(directory, {"lr0": 0.01})
    assert not directory.exists() and (aside / "weights" / "last.pdstate").is_file()
    assert aside.name.startswith("0000.other-")
    directory.mkdir()
    (directory / "hyp.yaml").write_text("lr0: 0.01\n")               # its own: kept (resumed)
    assert move_foreign(directory, {"lr0": 0.01}) is None and (directory / "hyp.yaml").is_file()
    assert move_foreign(tmp_path / "candidates" / "0001", {"lr0": 0.01}) is None   # none yet
