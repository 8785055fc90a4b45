"""PaddleDetection's tool flags and -o keys: each honoured (with its effect shown) or refused by name, never ignored;
train's -r resuming a checkpoint written the way PaddleDetection writes it; eval's --classwise and --output_eval."""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import DEMO_CONFIG, REPO, demo_overrides, one_line_error, run_tool, tool_module
from ppmulti.common import ppdet_flags, train_flags
from ppmulti.common.errors import UserError
from ppmulti.common.flags import parse_overrides
from ppmulti.rank import config as config_mod


def parser_of(tool: str) -> argparse.ArgumentParser:
    if tool == "train":
        return train_flags.build_parser()
    return tool_module({"eval": "eval", "infer": "infer", "export": "export_model"}[tool]).build_parser()


# ------------------------------------------------------------------------------------------ the flag table, golden
GOLDEN = [
    ("train", ["--use_vdl"], ["use_vdl=true"]),
    ("train", ["--use_vdl", "False"], ["use_vdl=false"]),       # PaddleDetection's type=bool: a value follows
    ("train", ["--use_vdl", "true", "--vdl_log_dir", "vdl_log_dir/scalar"],
     ["use_vdl=true", 'vdl_log_dir="vdl_log_dir/scalar"']),
    ("train", ["--fleet"], []),                                  # a no-op: ppmulti always trains through fleet
    ("train", ["--enable_ce", "True"], []),                     # read by rank/entry.py: --seed 0
    ("eval", ["--classwise", "--output_eval", "out/eval"], ['output_eval="out/eval"', "classwise=true"]),
    ("eval", ["--save_prediction_only"], ["save_prediction_only=true"]),
    ("infer", ["--save_results", "True", "--visualize", "True"], []),
    ("export", ["--export_serving_model", "False"], []),
]


@pytest.mark.parametrize("tool,argv,expected", GOLDEN)
def test_ppdet_flags_map_onto_config_keys(tool, argv, expected):
    args, extra = parser_of(tool).parse_known_args(["-c", "cfg.yml", *argv])
    assert extra == []
    assert ppdet_flags.resolve(args, tool) == expected
    # each item is a valid -o item: the keys land at the top level with the intended values
    parsed = parse_overrides(expected)
    assert all(k in config_mod.HONOURED_KEYS for k in parsed)


def _refused() -> list[tuple[str, str, list[str]]]:
    values = ((ppdet_flags.BOOL, ["true"]), (ppdet_flags.STR, ["x"]), (ppdet_flags.ANY, ["640", "640"]))
    return [(tool, flag.names[0], next(v for shape, v in values if flag.value is shape))
            for flag in ppdet_flags.FLAGS for tool, use in flag.uses.items() if use.kind == "refuse"]


@pytest.mark.parametrize("tool,flag,values", _refused())
def test_every_refused_flag_is_refused_by_name_through_the_tools_parser(tool, flag, values):
    args, extra = parser_of(tool).parse_known_args(["-c", "cfg.yml", flag, *values])
    assert extra == []
    with pytest.raises(UserError, match=re.escape(flag)):
        ppdet_flags.resolve(args, tool)


def test_every_ppdet_flag_of_every_tool_is_honoured_or_refused():
    """The table is the only place a PaddleDetection flag is defined: each use is one of four kinds, each refusal
    says why, and every tool's --help lists its flags."""
    for flag in ppdet_flags.FLAGS:
        for tool, use in flag.uses.items():
            assert tool in ppdet_flags.TOOLS
            assert use.kind in ("key", "tool", "noop", "refuse"), (flag, tool)
            if use.kind in ("refuse", "noop"):
                assert len(use.text) > 20, (flag, tool)
            if use.kind == "key":
                assert use.text in config_mod.HONOURED_KEYS, (flag, use)
    for tool in ppdet_flags.TOOLS:
        text = parser_of(tool).format_help()
        for spelling, _, _ in ppdet_flags.table(tool):
            assert spelling in text, (tool, spelling)
    assert "changes nothing" in parser_of("train").format_help()   # --fleet says it is a no-op


def test_train_options_from_ppdet_flags():
    from ppmulti.rank import entry

    opts = entry.resolve(train_flags.parse(["-c", str(DEMO_CONFIG), "--use_vdl", "false", "--fleet",
                                                      "--enable_ce", "True", "-o", "epoch=3"]))
    assert opts.overrides == ("epoch=3", "use_vdl=false") and opts.seed == 0
    with pytest.raises(UserError, match="--enable_ce.*--seed 3"):
        entry.resolve(train_flags.parse(["-c", str(DEMO_CONFIG), "--enable_ce", "--seed", "3"]))
    with pytest.raises(UserError, match="--save_prediction_only.*tools/eval.py"):
        entry.resolve(train_flags.parse(["-c", str(DEMO_CONFIG), "--save_prediction_only"]))
    with pytest.raises(UserError, match="-o save_prediction_only=True.*tools/eval.py"):
        entry.resolve(train_flags.parse(["-c", str(DEMO_CONFIG), "-o", "save_prediction_only=true"]))
    # -o save_prediction_only=false asks for nothing
    entry.resolve(train_flags.parse(["-c", str(DEMO_CONFIG), "-o", "save_prediction_only=false"]))


@pytest.mark.parametrize("argv,needle", [
    (["--visualize", "False"], "--visualize false"),
    (["--save_results", "0"], "--save_results false"),
    (["--slice_infer"], "--slice_infer"),
    (["--use_vdl", "True"], "--use_vdl"),
    (["--save_threshold", "0.5"], "--save_threshold"),
])
def test_infer_refusals_are_one_line(argv, needle, small_demo):
    proc = run_tool(["tools/infer.py", "-c", str(DEMO_CONFIG), "--infer_dir", str(small_demo), *argv])
    one_line_error(proc, needle)


def test_the_weights_key_is_what_infer_loads(small_demo, tmp_path):
    """PaddleDetection's `-o weights=W` (infer, eval, export_model): the file infer then looks for is W."""
    missing = tmp_path / "output" / "cfg" / "model_final"
    proc = run_tool(["tools/infer.py", "-c", str(DEMO_CONFIG), "-o", f"weights={missing}",
                     "--infer_dir", str(small_demo / "images" / "val")])
    one_line_error(proc, f"weights file not found: {missing}")


def test_export_model_refusals_are_one_line():
    one_line_error(run_tool(["tools/export_model.py", "-c", str(DEMO_CONFIG), "--export_serving_model", "True"]),
                   "--export_serving_model", "paddle_serving_client")
    one_line_error(run_tool(["tools/export_model.py", "-c", str(DEMO_CONFIG), "--slim_config", "q.yml"]),
                   "--slim_config", "PaddleSlim")


def test_export_model_speaks_ppdets_command_line():
    """PaddleDetection's `export_model.py -c CFG -o weights=W --output_dir D` becomes tools/export.py's -c mode."""
    export_model = tool_module("export_model")
    argv = export_model.export_argv(["-c", "cfg.yml", "-o", "weights=w.pdparams", "use_gpu=false",
                                     "--output_dir", "out"])
    assert argv == ["-c", "cfg.yml", "--output_dir", "out", "-o", "weights=w.pdparams", "use_gpu=false"]
    args = tool_module("export").parse(argv)
    assert not args.yolov5 and args.output_dir == "out" and args.formats == ["paddle"] and args.nms
    assert export_model.export_argv(["-c", "cfg.yml"])[3] == "output_inference"   # PaddleDetection's default


# ---------------------------------------------------------------------------------------------------- -o keys
# Where each honoured key's effect is shown: a test (file::name) that fails if the key stops working.
EFFECT_TESTS = {
    "amp": "test_amp.py::test_request_table", "amp_level": "test_amp.py::test_request_table",
    "custom_black_list": "test_amp.py::test_o1_casts_the_convolutions_and_honours_custom_lists",
    "custom_white_list": "test_amp.py::test_o1_casts_the_convolutions_and_honours_custom_lists",
    "init_loss_scaling": "test_amp.py::test_skipped_steps_and_scale_survive_a_checkpoint",
    "architecture": "test_configs.py::test_config_builds_and_runs",
    "num_classes": "test_data_agree.py::test_origin_of_num_classes",
    "depth_mult": "test_yolo_flags.py::test_cfg_unknown_name_and_yolov5_model_yaml",
    "width_mult": "test_yolo_flags.py::test_cfg_unknown_name_and_yolov5_model_yaml",
    "norm_type": "test_data_agree.py::test_a_base_dataset_files_80_classes_follow_the_data_and_the_lr_scales_from_"
                 "paddledetections_batch",
    "epoch": "test_hooks.py::test_evaluation_runs_on_validated_snapshot_epochs_and_always_the_last",
    "snapshot_epoch": "test_hooks.py::test_evaluation_runs_on_validated_snapshot_epochs_and_always_the_last",
    "log_iter": "test_board.py::test_epochs_shorter_than_the_log_interval_still_have_loss_curves",
    "worker_num": "test_eval_tool.py::test_val_flags_reach_the_config",
    "use_ema": "test_hooks.py::test_ema_hook_averages_a_toy_run_and_its_weights_are_the_ones_saved",
    "ema_decay": "test_ppdet_flags.py::test_ema_keys_reach_ppdets_model_ema",
    "ema_decay_type": "test_ppdet_flags.py::test_ema_keys_reach_ppdets_model_ema",
    "ema_black_list": "test_ppdet_flags.py::test_ema_keys_reach_ppdets_model_ema",
    "cycle_epoch": "test_ppdet_flags.py::test_ema_keys_reach_ppdets_model_ema",
    "eval_height": "test_configs.py::test_eval_size_follows_height_and_width",
    "eval_width": "test_configs.py::test_eval_size_follows_height_and_width",
    "eval_size": "test_configs.py::test_eval_size_follows_height_and_width",
    "ref_batch": "test_ref_batch.py::test_override_and_the_configs_own_win",
    "save_dir": "test_user_folder.py::test_a_file_in_the_way_of_a_run_directory_is_named",
    "use_gpu": "test_eval_tool.py::test_val_flags_reach_the_config",
    "pretrain_weights": "test_yolo_flags.py::test_run_dir_flags_and_weights_from_scratch",
    "weights": "test_ppdet_flags.py::test_the_weights_key_is_what_infer_loads",
    "use_vdl": "test_ppdet_flags.py::test_use_vdl_and_vdl_log_dir_steer_the_visualdl_log",
    "vdl_log_dir": "test_ppdet_flags.py::test_use_vdl_and_vdl_log_dir_steer_the_visualdl_log",
    "classwise": "test_ppdet_flags.py::test_eval_classwise_and_output_eval_on_two_ranks",
    "output_eval": "test_ppdet_flags.py::test_eval_classwise_and_output_eval_on_two_ranks",
    "save_prediction_only": "test_ppdet_flags.py::test_eval_classwise_and_output_eval_on_two_ranks",
    "metric": "test_ppdet_flags.py::test_refused_keys_stop_by_name_and_false_passes",
    "print_params": "test_ppdet_flags.py::test_resume_a_paddledetection_checkpoint",
    "find_unused_parameters": "test_ppdet_zoo.py::test_family_trains_an_epoch_on_two_ranks_and_evaluates",
    "profiler_options": "test_profiler_hook.py::test_profiler_options_record_the_range_and_stop_the_training",
}


def test_every_known_key_is_honoured_or_refused():
    honoured, refused = set(config_mod.HONOURED_KEYS), set(config_mod.REFUSED_KEYS)
    assert not honoured & refused
    assert config_mod.KNOWN_TOP_LEVEL_KEYS == honoured | refused
    for key, where in config_mod.HONOURED_KEYS.items():
        assert where, key
    assert set(EFFECT_TESTS) == honoured, honoured ^ set(EFFECT_TESTS)
    for key, test in EFFECT_TESTS.items():
        path, name = test.split("::")
        assert f"def {name}(" in (REPO / "tests" / path).read_text(), test


@pytest.mark.parametrize("key", sorted(config_mod.REFUSED_KEYS))
def test_refused_keys_stop_by_name_and_false_passes(key):
    with pytest.raises(UserError, match=rf"-o {key}=True: .*; remove it"):
        config_mod.load(DEMO_CONFIG, [f"{key}=true"])
    config_mod.load(DEMO_CONFIG, [f"{key}=false"])   # PaddleDetection's runtime.yml: print_flops: false
    with pytest.raises(UserError, match="-o metric=WiderFace: ppmulti evaluates COCO or VOC bbox mAP"):
        config_mod.load(DEMO_CONFIG, ["metric=WiderFace"])   # VOC is scored (engine/evaluator.py: VocEvaluator)
    assert config_mod.load(DEMO_CONFIG, ["metric=COCO"])["metric"] == "COCO"


def test_ema_keys_reach_ppdets_model_ema():
    """The EMA hook hands every EMA key of the config to ppdet's ModelEMA (PaddleDetection's Trainer does the same)."""
    from toys import toy_trainer

    from ppmulti.rank.engine.hooks import EMAHook

    hook = EMAHook()
    trainer = toy_trainer(cfg={"use_ema": True, "ema_decay": 0.5, "ema_decay_type": "exponential",
                               "cycle_epoch": 3, "ema_black_list": ["linear.bias"]})
    hook.before_train(trainer)
    ema = trainer.ema
    assert (ema.decay, ema.ema_decay_type, ema.cycle_epoch) == (0.5, "exponential", 3)
    assert set(ema.ema_black_list) == {"linear.bias"}


def test_ppdets_ema_filter_no_grad_fails_on_a_frozen_weight():
    """Why -o ema_filter_no_grad=true is refused (config.REFUSED_KEYS): ppdet 2.6's ModelEMA appends to the set its
    black list is, so any frozen weight stops it; with none frozen the key changes nothing. When this test fails,
    ppdet has fixed it and the key can move to HONOURED_KEYS."""
    import paddle
    from ppdet.optimizer import ModelEMA

    model = paddle.nn.Linear(2, 2)
    ModelEMA(model, ema_filter_no_grad=True)   # nothing frozen: accepted, and nothing filtered
    model.weight.stop_gradient = True
    with pytest.raises(AttributeError, match="'set' object has no attribute 'append'"):
        ModelEMA(model, ema_filter_no_grad=True)


def test_use_vdl_and_vdl_log_dir_steer_the_visualdl_log(tmp_path):
    """The VisualDL hook on a toy run: on by default under RUN_DIR/vdl, elsewhere with vdl_log_dir, off with
    use_vdl: false (PaddleDetection's --use_vdl / --vdl_log_dir through -o)."""
    from toys import toy_trainer

    from ppmulti.rank.engine.hooks import VisualDLHook

    for name, cfg, where in (("default", {}, tmp_path / "default" / "vdl"),
                             ("moved", {"vdl_log_dir": str(tmp_path / "elsewhere")}, tmp_path / "elsewhere"),
                             ("off", {"use_vdl": False}, None)):
        run = tmp_path / name
        toy_trainer(epochs=1, run_dir=run, hooks=[VisualDLHook()], cfg={"epoch": 1, **cfg}).train()
        if where is None:
            assert not list(run.rglob("vdlrecords.*"))
        else:
            assert list(where.glob("vdlrecords.*")), (name, list(tmp_path.rglob("*")))
    assert not (tmp_path / "moved" / "vdl").exists()
    assert len(list(tmp_path.rglob("vdlrecords.*"))) == 2


# -------------------------------------------------------------------------------- -r: PaddleDetection's checkpoint
def _ppdet_kind(tmp_path, *files) -> Path:
    for name in files:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(b"x")
    return tmp_path


def test_resume_path_kinds(tmp_path):
    """-r PATH: a run directory or a stem with ppmulti's .pdstate is ppmulti's resume; a stem with .pdparams and
    .pdopt (and no .pdstate) is PaddleDetection's; .pdparams alone is refused, naming --weights."""
    from ppmulti.rank.engine.resume_plan import PpdetCheckpoint, ppdet_checkpoint

    root = _ppdet_kind(tmp_path, "output/cfg/3.pdparams", "output/cfg/3.pdopt", "output/cfg/model_final.pdparams",
                       "output/cfg/model_final.pdopt", "output/cfg/model_final.pdema", "run/weights/last.pdparams",
                       "run/weights/last.pdstate", "lone/w.pdparams")
    for path in ("output/cfg/3", "output/cfg/3.pdparams", "output/cfg/3.pdopt"):
        found = ppdet_checkpoint(str(root / path))
        assert found == PpdetCheckpoint(str(root / "output/cfg/3")) and found.name_epoch == 4
    assert ppdet_checkpoint(str(root / "output/cfg/model_final")).name_epoch is None
    for path in ("run", "run/weights/last", "run/weights/last.pdparams", "run/weights", "missing/x"):
        assert ppdet_checkpoint(str(root / path)) is None, path
    assert ppdet_checkpoint(True) is None and ppdet_checkpoint(None) is None
    with pytest.raises(UserError, match=r"w\.pdparams has no training state.*--weights .*w\.pdparams"):
        ppdet_checkpoint(str(root / "lone/w"))


def test_a_launch_restart_before_the_first_checkpoint_begins_from_the_ppdet_checkpoint_again(tmp_path, monkeypatch):
    """--max_restarts: a rank restarted before its run saved anything starts that run again in the same directory;
    a run begun with -r PaddleDetection's checkpoint begins from that checkpoint again, not from scratch."""
    from ppmulti.common.envvars import PPMULTI_LAUNCH_DIR, PPMULTI_RESTART
    from ppmulti.common.rundir import RUN_DIR_MARKER
    from ppmulti.rank.engine.hooks.resume import ResumeHook
    from ppmulti.rank.engine.trainer import RunPlan

    root = _ppdet_kind(tmp_path, "output/cfg/0.pdparams", "output/cfg/0.pdopt")
    (tmp_path / "launch").mkdir()
    (tmp_path / "launch" / RUN_DIR_MARKER).write_text(str(tmp_path / "run") + "\n")
    monkeypatch.setenv(PPMULTI_LAUNCH_DIR, str(tmp_path / "launch"))
    monkeypatch.setenv(PPMULTI_RESTART, "1")
    for resume, kept in ((str(root / "output/cfg/0"), str(root / "output/cfg/0")), (None, None)):
        plan = ResumeHook(RunPlan(config="c.yml", resume=resume)).plan
        assert (plan.source, plan.checkpoint, plan.ppdet, plan.run_dir) == ("restart", kept, kept is not None,
                                                                           str(tmp_path / "run"))
        assert plan.notes[0].endswith(f"starting it again from {kept}" if kept else "starting it again")


def _toy_parts(seed: int):
    """A toy model with a BatchNorm, Momentum on a piecewise schedule (ppdet's LearningRate returns one)."""
    import paddle

    paddle.seed(seed)
    model = paddle.nn.Sequential(paddle.nn.Linear(3, 4), paddle.nn.BatchNorm1D(4), paddle.nn.Linear(4, 1))
    lr = paddle.optimizer.lr.PiecewiseDecay([3, 6], [0.1, 0.01, 0.001])
    opt = paddle.optimizer.Momentum(learning_rate=lr, momentum=0.9, parameters=model.parameters())
    return model, lr, opt


def _step(model, lr, opt, steps: int) -> None:
    import paddle

    for _ in range(steps):
        model(paddle.randn([4, 3])).mean().backward()
        opt.step()
        opt.clear_grad()
        lr.step()


@pytest.mark.parametrize("use_ema", [False, True])
def test_restore_a_checkpoint_written_by_ppdets_save_model(tmp_path, use_ema, caplog):
    """ppdet's own save_model writes epoch index 1 (2 epochs done, 3 steps each); a new process-like build whose
    parameters carry other names (a layer built first) gets its weights, its Momentum velocities under its own
    names, epoch 2 and the lr schedule at step 6; with EMA the .pdparams seed the EMA and .pdema the model."""
    import paddle
    from ppdet.optimizer import ModelEMA
    from ppdet.utils.checkpoint import save_model

    from ppmulti.rank.engine.hooks.resume import PpdetCheckpoint, restore_ppdet
    from ppmulti.rank.engine.trainer import Trainer, RunPlan

    model, lr, opt = _toy_parts(1)
    ema = ModelEMA(model) if use_ema else None
    for _ in range(6):
        _step(model, lr, opt, 1)
        if ema is not None:
            ema.update()
    saved_model = {k: v.numpy().copy() for k, v in model.state_dict().items()}
    velocity = opt._accumulators["velocity"]
    saved_velocity = {p.name: velocity[p.name].numpy().copy() for p in model.parameters() if p.name in velocity}
    assert len(saved_velocity) == 6 and any(np.abs(v).sum() > 0 for v in saved_velocity.values())
    if use_ema:   # PaddleDetection's Trainer: the model holds the EMA while it saves, the .pdema the trained weights
        ema_weights = {k: v.numpy().copy() for k, v in ema.apply().items()}
        trained = {k: paddle.to_tensor(v) for k, v in saved_model.items()}
        model.set_dict(ema.apply())
        save_model(trained, opt, str(tmp_path), "1", 2, ema_model=model.state_dict())
    else:
        save_model(model.state_dict(), opt, str(tmp_path), "1", 2)
    old_names = {k: v.name for k, v in model.state_dict().items()}

    paddle.nn.Linear(7, 7)   # names shift: linear_N+1 ... in the rebuilt model
    model2, lr2, opt2 = _toy_parts(2)
    new_names = {k: v.name for k, v in model2.state_dict().items()}
    assert new_names != old_names
    trainer = Trainer(model2, [{"x": 0}] * 3, opt2, lr=lr2, epochs=5, run_dir=tmp_path / "run",
                      cfg={"log_iter": 1, "epoch": 5}, opts=RunPlan(config="toy.yml"), world=1, rank=0)
    trainer.ema = ModelEMA(model2) if use_ema else None
    restore_ppdet(trainer, PpdetCheckpoint(str(tmp_path / "1")))
    for k, v in model2.state_dict().items():
        np.testing.assert_array_equal(v.numpy(), saved_model[k], err_msg=k)
    held = opt2._accumulators_holder   # Paddle creates the accumulators from these at the first step
    restored = {name: held[f"{name}_velocity_0"] for key, name in new_names.items() if old_names[key] in saved_velocity}
    assert len(restored) == 6
    for key, name in new_names.items():
        if name in restored:
            np.testing.assert_array_equal(np.asarray(restored[name]), saved_velocity[old_names[key]], err_msg=key)
    assert trainer.state.epoch == 2 and trainer.state.global_step == 6
    assert lr2.last_epoch == 6 and math.isclose(lr2.get_lr(), 0.001)
    assert "nothing is left to train" not in caplog.text
    trainer.cfg["epoch"] = 2   # a run no longer than the checkpoint's: said, not silently empty
    restore_ppdet(trainer, PpdetCheckpoint(str(tmp_path / "1")))
    assert "2 of the run's 2 epochs done, so nothing is left to train" in caplog.text
    if use_ema:
        assert trainer.ema.step == 6
        for k, v in trainer.ema.state_dict.items():
            np.testing.assert_allclose(v.numpy(), ema_weights[k], err_msg=k)


# ------------------------------------------------------------------------------------------------- slow: real runs
WRITE_PPDET_CHECKPOINT = r"""
import sys
from ppmulti.rank import config as config_mod
from ppdet.core.workspace import create
from ppdet.optimizer import ModelEMA
from ppdet.utils.checkpoint import save_model
import copy, paddle
cfg = config_mod.load(sys.argv[1], sys.argv[3:])
paddle.seed(5)
model = create(cfg.architecture)
lr = create("LearningRate")(6)
opt = create("OptimizerBuilder")(lr, model)
ema = ModelEMA(model, decay=cfg.get("ema_decay", 0.9998), ema_black_list=cfg.get("ema_black_list"))
for _ in range(2):   # two optimizer steps on a weight penalty: moments and a schedule position to carry over
    loss = sum((p * p).sum() for p in model.parameters() if not p.stop_gradient) * 1e-4
    loss.backward(); opt.step(); opt.clear_grad(); lr.step(); ema.update()
# as PaddleDetection's Trainer saves epoch index 0 with use_ema: EMA values in the model, its own weights in .pdema
trained = copy.deepcopy(model.state_dict())
model.set_dict(ema.apply())
save_model(model.state_dict(), opt, sys.argv[2], "0", 1, ema_model=trained)
print("saved", len(opt.state_dict()))
"""


@pytest.mark.slow
def test_resume_a_paddledetection_checkpoint(small_demo, tmp_path):
    """`-r output/ppyoloe_demo/0` (a checkpoint written by ppdet's save_model after epoch index 0, with EMA)
    continues at epoch 2 in a new run directory (ppmulti's own --resume of a run directory: test_train.py's
    test_resume_continues_where_it_stopped; which kind a path is: test_resume_path_kinds)."""
    ckpt = tmp_path / "output" / "ppyoloe_demo"
    over = [*demo_overrides(small_demo), "snapshot_epoch=1"]
    proc = run_tool(["-c", WRITE_PPDET_CHECKPOINT, str(DEMO_CONFIG), str(ckpt), *over], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert {p.name for p in ckpt.iterdir()} == {"0.pdparams", "0.pdopt", "0.pdema"}
    out = tmp_path / "run"
    proc = run_tool([str(REPO / "tools/train.py"), "-c", str(DEMO_CONFIG), "-o", *over, "print_params=true",
                     "--epochs", "2", "-r", str(ckpt / "0"), "--output", str(out)], cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    log = (out / "train.log").read_text()
    assert re.search(r"resumed PaddleDetection checkpoint \S+/0 at epoch 1: weights \(EMA from \.pdparams\), "
                     r"optimizer state \(\d+ tensors\), lr at step \d+", log), log[-3000:]
    assert re.search(r"model params: \d+\.\d{3} M \(print_params\)", log)   # -o print_params=true
    rows = (out / "results.csv").read_text().strip().splitlines()
    assert len(rows) == 2, rows   # a header and epoch 2 only
    assert not any(p.suffix in (".pdopt", ".pdema") for p in out.rglob("*"))
    assert json.loads(proc.stdout.strip().splitlines()[-1])["run_dir"] == str(out)


@pytest.mark.slow
def test_eval_classwise_and_output_eval_on_two_ranks(ppyoloe_run, small_demo, tmp_path):
    """PaddleDetection's `eval.py --classwise --output_eval DIR` under a 2-rank launch: rank 0 gathers both shards,
    prints one per-category table whose mean is the mAP50-95, and writes every image's detections to DIR/bbox.json;
    --save_prediction_only writes bbox.json and scores nothing."""
    weights = ppyoloe_run.path / "weights" / "best.pdparams"
    common = [str(REPO / "tools/eval.py"), "-c", str(DEMO_CONFIG), "-o", *demo_overrides(small_demo),
              "--weights", str(weights)]
    proc = run_tool(["-m", "ppmulti.cli", "launch", "--nproc_per_node", "2", "--log_dir", str(tmp_path / "log"),
                     *common, "--classwise", "--output_eval", str(tmp_path / "ev")],
                    cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads([ln for ln in proc.stdout.splitlines() if ln.startswith("{")][-1])
    assert result["images"] == 16
    names = [c["name"] for c in json.loads((small_demo / "annotations" / "instances_val.json").read_text())
             ["categories"]]
    assert sorted(result["class_AP"]) == sorted(names)
    aps = [v for v in result["class_AP"].values() if v is not None]
    assert math.isclose(sum(aps) / len(aps), result["mAP50_95"], abs_tol=1e-3)
    console = proc.stdout + proc.stderr
    assert console.count("Per-category bbox AP") == 1
    for name in names:
        assert re.search(rf"\b{name}\s+\|\s+\d\.\d{{3}}", console), name
    detections = json.loads((tmp_path / "ev" / "bbox.json").read_text())
    assert {d["image_id"] for d in detections} == set(range(1, 17)) or len({d["image_id"] for d in detections}) > 8
    assert set(detections[0]) == {"image_id", "category_id", "bbox", "score"}
    proc = run_tool([*common, "--save_prediction_only"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["mAP50"] is None and result["predictions"] == "bbox.json"
    assert "not scored (save_prediction_only)" in proc.stderr
    assert len(json.loads((tmp_path / "bbox.json").read_text())) == len(detections)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
