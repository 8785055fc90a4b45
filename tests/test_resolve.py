"""resolve: train command lines (YOLOv5's, PaddleDetection's, ultralytics' keys) -> the frozen RunPlan, against a
golden file; bad values refused in one line before any rank starts; the ranks of a launch train the launcher's plan.

The golden file is written by the test when asked: ``WRITE_GOLDEN=1 python -m pytest tests/test_resolve.py``;
read the diff before committing it."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO, clean_env, demo_overrides
from ppmulti.common.errors import UserError
from ppmulti.common.gpu_switches import USER_CHOICE
from ppmulti.common.paths import ROOT
from ppmulti.common.ultra_keys import resolve_line
from ppmulti.rank.engine.made_plan import read_made
from ppmulti.rank.plan import ConfigEdit, RunPlan
from ppmulti.common import train_flags
from ppmulti.common.paths import CONFIGS
from ppmulti.rank.engine.resume_plan import Located
from ppmulti.rank.entry import Facts, plan_from_environ, plan_message, plan_of, resolve_script_args, with_device

GOLDEN_FILE = REPO / "tests" / "fixtures" / "resolve_golden.json"
HYP = "configs/hyps/hyp.scratch-low.yaml"
DEMO_CONFIG = REPO / "configs" / "demo" / "ppyoloe_demo.yml"

# (name, the train script's argv) -> the plan; paths are written relative to the repository
CASES = [
    ("yolov5_readme", ["--data", "data/coco128.yaml", "--cfg", "yolov5s", "--weights", "", "--img", "640",
                       "--batch", "16", "--epochs", "3", "--device", "cpu"]),
    ("yolov5_many_flags", ["--data", "d.yaml", "--cfg", "yolov5n.yaml", "--hyp", HYP, "--weights", "",
                           "--img", "320", "--batch-size", "32", "--epochs", "10", "--optimizer", "AdamW",
                           "--cos-lr", "--label-smoothing", "0.1", "--rect", "--cache", "--save-period", "2",
                           "--patience", "5", "--freeze", "10", "--noplots", "--project", "runs/p", "--name", "e",
                           "--exist-ok", "--workers", "2", "--seed", "7", "--sync-bn", "--multi-scale",
                           "--mosaic-buffer", "64"]),
    ("yolov5_img_0_rounds_to_64", ["--data", "d.yaml", "--cfg", "yolov5n", "--weights", "", "--img", "0"]),
    ("yolov5_img_100_rounds_to_128", ["--data", "d.yaml", "--cfg", "yolov5n", "--weights", "", "--img", "100",
                                      "--noval"]),
    ("paddledetection", ["-c", "configs/ppyoloe/ppyoloe_crn_s_300e_coco.yml", "--eval", "-o", "epoch=3",
                         "worker_num=2", "--use_vdl", "false", "--amp", "--fleet", "-r", "output/my/model_final"]),
    ("paddledetection_output", ["-c", "configs/yolo.yml", "--output", "out/run", "--epochs", "2", "--batch", "8",
                                "--accumulate", "2", "--no-amp", "--deterministic", "--device", "cpu"]),
]
# ultralytics' keys, translated by ppmulti yolo (ppmulti/common/ultra_keys.py) into train argv
ULTRA_CASES = [
    ("ultralytics_train", ["detect", "train", "model=yolov8n.yaml", "data=coco8.yaml", "epochs=3", "imgsz=320",
                           "batch=16", "device=cpu", "project=runs/u", "name=a", "cos_lr=True", "patience=0"]),
    ("ultralytics_yolov5", ["train", "model=yolov5s.yaml", "data=d.yaml", "pretrained=False", "epochs=1"]),
]



def _model(name: str, size: str, epochs: int = 300) -> str:
    return str(CONFIGS / name / f"{name}_{size}_{epochs}e_coco.yml")


# the facts each case's gather reads on a machine without cached release weights, written down: the pure core
# (plan_of) gives the golden plan from them with no file, network or package look-up
CASE_FACTS = {
    "yolov5_readme": Facts(model_config=_model("yolov5", "s")),
    "yolov5_many_flags": Facts(model_config=_model("yolov5", "n")),
    "yolov5_img_0_rounds_to_64": Facts(model_config=_model("yolov5", "n")),
    "yolov5_img_100_rounds_to_128": Facts(model_config=_model("yolov5", "n")),
    "paddledetection": Facts(resume=Located("output/my/model_final")),
    "paddledetection_output": Facts(),
    "ultralytics_train": Facts(model_config=_model("yolov8", "n", 500)),
    "ultralytics_yolov5": Facts(model_config=_model("yolov5", "s")),
}
# the run a bare --resume found (nowhere on disk: plan_of reads no file) and the flags its opt.yaml kept
RESUMED_RUN = Path("runs/train/exp3")
RESUMED_RECORD = {"cfg": "yolov5n", "data": "d.yaml", "epochs": 30, "batch": 32, "noval": True, "rect": True,
                  "cache": "ram", "seed": 5, "logger": ["tb"], "patience": None, "workers": 2, "sync_bn": True}
ANCHORS = "YOLOv5Head.anchors=[[[9.5, 12.0], [16.0, 30.0], [33.0, 23.0]], [[30.0, 61.0], [62.0, 45.0], " \
          "[59.0, 119.0]], [[116.0, 90.0], [156.0, 198.0], [373.0, 326.0]]]"
# cases of the pure core alone: their facts need files or the network, which the wrapper would really read
CORE_CASES = [
    ("core_bare_resume_with_record", ["--resume"],
     Facts(resume=Located(str(RESUMED_RUN), RESUMED_RUN), record=RESUMED_RECORD)),
    ("core_bare_resume_flags_given_again", ["--resume", "--workers", "4", "--logger", "none"],
     Facts(resume=Located(str(RESUMED_RUN), RESUMED_RUN), record=RESUMED_RECORD)),
    # --weights yolov5s.pt, downloaded into the cache: the .pt names the model and carries its own anchors
    ("core_weights_release_names_the_model", ["--data", "d.yaml", "--weights", "yolov5s.pt", "--img", "320"],
     Facts(weights="/cache/ppmulti/yolov5s.pt", weights_cfg="yolov5s", weights_overrides=(ANCHORS,),
           model_config=_model("yolov5", "s"))),
    # a YOLOv5 line without --weights, the release weights of its model already cached: it starts from them
    ("core_no_weights_cached_release", ["--data", "d.yaml", "--cfg", "yolov5m"],
     Facts(weights="/cache/ppmulti/yolov5m.pt", model_config=_model("yolov5", "m"))),
]


def _plain(value):
    """The plan as golden JSON: the repository's own path written as <repo>."""
    if isinstance(value, str):
        return value.replace(str(ROOT), "<repo>")
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


@pytest.fixture
def neutral_env(monkeypatch):
    """Paths relative to the repository, as the golden file writes them."""
    monkeypatch.chdir(REPO)


def _all_cases() -> list[tuple[str, list[str]]]:
    ultra = [(name, list(resolve_line(words).argv)) for name, words in ULTRA_CASES]
    return CASES + ultra


def _resolved(argv: list[str]) -> dict:
    plan = resolve_script_args(argv, environ={})   # no FLAGS_cudnn_* of the user's to leave alone
    assert plan is not None
    assert RunPlan.from_json(plan.to_json()) == plan   # JSON round trip: what a rank reads is what was resolved
    return _plain(json.loads(plan.to_json()))


def _core(argv: list[str], facts: Facts) -> RunPlan:
    args = train_flags.parse(list(argv))
    with_device(args)
    return plan_of(args, facts, {})


def _core_resolved(argv: list[str], facts: Facts) -> dict:
    plan = _core(argv, facts)
    assert RunPlan.from_json(plan.to_json()) == plan
    return _plain(json.loads(plan.to_json()))


def test_a_users_own_cudnn_choice_is_left_alone(neutral_env):
    plan = resolve_script_args(["--cfg", "yolov5n", "--weights", ""], environ={USER_CHOICE[0]: "0"})
    assert plan.switches.mode == "default" and not plan.switches.flags


def test_golden_plans(neutral_env, capsys):
    """Every case through the wrapper (resolve: facts gathered here) and through the pure core (plan_of: the
    facts written above); both give the golden plan."""
    got = {name: {"argv": _plain(argv), "plan": _resolved(argv)} for name, argv in _all_cases()}
    got.update({name: {"argv": _plain(argv), "plan": _core_resolved(argv, facts)} for name, argv, facts in CORE_CASES})
    if os.environ.get("WRITE_GOLDEN"):
        GOLDEN_FILE.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
    golden = json.loads(GOLDEN_FILE.read_text())
    assert sorted(got) == sorted(golden)
    for name in got:
        assert got[name] == golden[name], name
    assert sorted(CASE_FACTS) == sorted(name for name, _ in _all_cases())
    for name, argv in _all_cases():
        assert _core_resolved(argv, CASE_FACTS[name]) == golden[name]["plan"], name


def test_the_pure_core_reads_no_file_and_no_network(neutral_env, monkeypatch, tmp_path):
    """plan_of with facts naming files that do not exist: no open, no socket, and the plan says what they said."""
    import builtins
    import socket

    def refused(*args, **kwargs):
        raise AssertionError(f"I/O in the pure core: {args[:1]}")

    monkeypatch.chdir(tmp_path)   # nothing of runs/train/exp3 here
    monkeypatch.setattr(builtins, "open", refused)
    monkeypatch.setattr(socket, "socket", refused)
    monkeypatch.setattr(Path, "read_text", refused)
    name, argv, facts = CORE_CASES[0]
    plan = _core(argv, facts)
    assert plan.config == str(RESUMED_RUN / "config.yml") and plan.resume == str(RESUMED_RUN)
    assert (plan.validate, plan.edit.rect, plan.cache, plan.seed, plan.loggers) == (False, True, "ram", 5,
                                                                                    ("tensorboard",))
    plan = _core(*CORE_CASES[2][1:])
    assert plan.weights == "/cache/ppmulti/yolov5s.pt" and plan.edit.cfg == "yolov5s"
    assert plan.overrides[-1] == ANCHORS and plan.record["weights"] == "/cache/ppmulti/yolov5s.pt"


def test_the_pure_core_refuses_what_the_facts_say(neutral_env):
    resumed = Facts(resume=Located(str(RESUMED_RUN), RESUMED_RUN), record=RESUMED_RECORD,
                    missing_trackers=frozenset({"tensorboard"}))
    with pytest.raises(UserError, match="--logger tensorboard: TensorBoard is not installed"):
        _core(["--resume"], resumed)   # the tracker the resumed run's opt.yaml asks for
    assert _core(["--resume", "--logger", "none"], resumed).loggers == ()
    with pytest.raises(UserError, match="give the model once"):
        _core(["-c", "a.yml", "--cfg", "yolov5s"], Facts(model_config=_model("yolov5", "s")))
    with pytest.raises(ValueError, match="Facts.model_config"):
        _core(["--cfg", "yolov5n"], Facts())   # a test that forgets a fact is told, not given a guess


def test_img_rounding_is_said_once(neutral_env, capsys):
    """YOLOv5's check_img_size in train.py (utils/general.py, ultralytics/yolov5 master): up to a multiple of the
    max stride 32, at least 2 x 32; it warns when the size changes."""
    for img, want in (("0", 64), ("32", 64), ("65", 96), ("100", 128), ("640", 640)):
        plan = resolve_script_args(["--cfg", "yolov5n", "--weights", "", "--img", img])
        assert plan.edit.imgsz == want
        err = capsys.readouterr().err
        warned = [line for line in err.splitlines() if line.startswith("WARNING: --imgsz")]
        assert len(warned) == (0 if int(img) == want else 1), err
        if warned:
            assert f"--imgsz {img} must be a multiple of the max stride 32" in warned[0]
            assert warned[0].endswith(f"training at --imgsz {want}")


@pytest.mark.parametrize("argv, needle", [
    (["--mosaic-buffer", "-1"], "--mosaic-buffer -1: give 0"),
    (["--epochs", "0"], "--epochs 0: train at least 1 epoch"),
    (["--epochs", "-3"], "--epochs -3"),
    (["--batch", "0"], "--batch 0: give the global batch, at least 1"),
    (["--batch", "-1"], "AutoBatch"),
    (["--workers", "-1"], "--workers -1: give 0"),
    (["--patience", "-1"], "--patience -1: give 0 (never stop early)"),
    (["--seed", "-2"], "--seed -2"),
    (["--freeze", "-1"], "--freeze -1"),
    (["--label-smoothing", "1.5"], "--label-smoothing 1.5"),
    (["--accumulate", "0"], "--accumulate 0"),
    (["--single-cls"], "--single-cls needs --data"),
])
def test_bad_values_are_refused_in_resolve(neutral_env, argv, needle):
    with pytest.raises(UserError, match=None) as info:
        resolve_script_args(["--cfg", "yolov5n", "--weights", "", *argv])
    assert needle in str(info.value) and "\n" not in str(info.value)


def test_values_yolov5_takes_as_off_stay_accepted(neutral_env):
    """YOLOv5 saves periodically only when --save-period > 0 and never stops early with --patience 0."""
    plan = resolve_script_args(["--cfg", "yolov5n", "--weights", "", "--save-period", "0", "--patience", "0"])
    assert (plan.save_period, plan.patience) == (0, 0)


def test_plan_is_frozen_and_plain():
    plan = RunPlan(config="c.yml", overrides=["a=1"], freeze=[3], edit=ConfigEdit(imgsz=64))
    assert plan.overrides == ("a=1",) and plan.freeze == (3,)
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.epochs = 3   # type: ignore[misc]
    assert RunPlan.from_json(plan.to_json()) == plan


def test_a_rank_reads_the_plan_only_for_its_own_arguments():
    plan = RunPlan(config="c.yml", epochs=1)
    worker = {"PADDLE_TRAINER_ID": "1", "PADDLE_TRAINERS_NUM": "2"}
    env = {**worker, "PPMULTI_RUN_PLAN": plan_message(plan, ["-c", "c.yml"])}
    assert plan_from_environ(["-c", "c.yml"], env) == plan
    assert plan_from_environ(["-c", "other.yml"], env) is None        # other flags: the rank resolves its own
    assert plan_from_environ(["-c", "c.yml"], {"PPMULTI_RUN_PLAN": env["PPMULTI_RUN_PLAN"]}) is None   # run alone


def test_the_launching_process_imports_no_paddle():
    code = ("import sys; from ppmulti.rank.entry import resolve_script_args; "
            "p = resolve_script_args(['--cfg', 'yolov5n', '--weights', '', '--img', '128', '--device', 'cpu']); "
            "print(p.edit.imgsz, 'paddle' in sys.modules, 'ppdet' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["128", "False", "False"]


def _launch(args: list[str], cwd: Path, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ppmulti.cli", "launch", "--nproc_per_node", "2", "--device", "cpu",
                           str(REPO / "tools" / "train.py"), *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env=clean_env())


def test_launch_refuses_a_bad_value_at_once_before_any_rank(tmp_path):
    started = time.monotonic()
    proc = _launch(["-c", str(REPO / "configs" / "yolo.yml"), "--mosaic-buffer", "-1"], tmp_path, timeout=60)
    took = time.monotonic() - started
    assert proc.returncode == 2 and took < 3, (took, proc.stderr)
    assert proc.stderr.strip().splitlines() == ["error: --mosaic-buffer -1: give 0 (extra tiles from the whole set) "
                                                "or a number of images"]
    assert not (tmp_path / "log").exists()   # Paddle's launcher never ran: no rank started


@pytest.mark.slow
@pytest.mark.multiproc
def test_two_ranks_train_the_launchers_plan(small_demo, tmp_path):
    """``ppmulti launch --nproc_per_node 2 --device cpu`` of a 1-epoch tiny run with ``--img 100``: the launcher
    resolves it once (one rounding warning, in the launcher's own output), the ranks train that plan (no rank
    warns again: none parsed its argv), and rank 0 leaves it in the run directory as run_plan.json."""
    out = tmp_path / "run"
    proc = _launch(["-c", str(DEMO_CONFIG), "-o", *demo_overrides(small_demo), "--batch", "8", "--epochs", "1",
                    "--img", "100", "--output", str(out)], tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    text = (out / "run_plan.json").read_text()
    saved = RunPlan.from_json(text)
    assert (saved.epochs, saved.batch, saved.edit.imgsz, saved.output) == (1, 8, 128, str(out))
    # beside it, what rank 0 made once the world and the data were known, and both ranks trained with it
    made = read_made(text)
    assert (made.batch.global_batch, made.batch.per_rank, made.batch.world_size) == (8, 4, 2), made
    assert made.lr.effective_batch == made.batch.effective_batch and made.steps_per_epoch == 6, made  # 48 / 8
    for log_file in (out / "train.log", out / "logs" / "rank1.log"):
        plan_line = next(line for line in log_file.read_text().splitlines() if "world size 2, " in line)
        assert made.batch.describe() in plan_line and made.lr.describe() in plan_line, (log_file, plan_line)
    texts = [proc.stdout, proc.stderr] + [p.read_text(errors="replace") for p in (tmp_path / "log").rglob("*")
                                          if p.is_file()]
    warnings = sum(text.count("WARNING: --imgsz 100") for text in texts)
    assert warnings == 1, warnings   # the launcher's; a rank that parsed argv again would say it too


@pytest.mark.parametrize("keys,want", [((), (True, False)), (("nms=True",), (True, False)),
                                       (("nms=False",), (True, True)), (("rect=True",), (True, False))])
def test_an_ultralytics_line_evaluates_each_epoch_as_its_trainer_does(neutral_env, keys, want):
    """ultralytics 8.4.190's trainer validates rect batches (DetectionTrainer.build_dataset: rect=mode == "val",
    whatever rect= says) with the head end2end = nms is False (BaseValidator.__call__); the run's plan says so.
    A YOLOv5 or PaddleDetection line keeps its config's square letterbox and head."""
    from ppmulti.procs.yolo_command import args_environ

    command = resolve_line(["train", "model=yolo26n.yaml", "data=d.yaml", "epochs=1", *keys])
    plan = plan_of(train_flags.parse(list(command.argv)), Facts(model_config=_model("yolo26", "n", 500)),
                   args_environ(command))
    assert (plan.val_rect, plan.val_end2end) == want
    assert plan.edit.rect is ("rect=True" in keys)   # rect= itself: rect TRAINING batches, as before
    plan = _core(["--data", "d.yaml", "--cfg", "yolov5n", "--weights", ""], CASE_FACTS["yolov5_img_0_rounds_to_64"])
    assert (plan.val_rect, plan.val_end2end) == (False, None)
