"""The hooks one at a time, then the loop built from toy parts (tests/toys.py): call order, stops, checkpoints."""

from __future__ import annotations

import os
import signal
from types import SimpleNamespace

import pytest

from ppmulti.rank.engine.hooks import (HOOK_POINTS, CheckpointHook, ConsoleLogHook, EarlyStopHook, EMAHook,
                                       EvaluationHook, Hook, Interrupted, PlotsHook, ResultsHook, ResumeHook,
                                       StopOnSignalHook, VisualDLHook)
from ppmulti.rank.engine import checkpoint as ckpt_mod
from ppmulti.rank.engine.trainer import RunPlan
from toys import Recorder, ScriptedEvaluation, toy_trainer


def _trainer(epochs: int = 10, **kw) -> SimpleNamespace:
    base = dict(cfg={"epoch": epochs, "log_iter": 2}, world=1, stop_training=False, interrupted=None,
                steps_per_epoch=4, run_dir="run", opts=SimpleNamespace(validate=True))
    base.update(kw)
    return SimpleNamespace(**base)


def _stats(epoch: int, m: float | None) -> SimpleNamespace:
    return SimpleNamespace(epoch=epoch, metrics=None if m is None else {"mAP50": m, "mAP50_95": m})


def test_early_stop_sets_the_flag_after_patience_epochs_without_improvement():
    hook, trainer = EarlyStopHook(patience=2), _trainer()
    for epoch, m in enumerate([0.1, 0.3, 0.2]):
        hook.after_epoch(trainer, _stats(epoch, m))
        assert not trainer.stop_training
    hook.after_epoch(trainer, _stats(3, None))     # an epoch without evaluation does not count
    assert not trainer.stop_training
    hook.after_epoch(trainer, _stats(4, 0.25))     # epoch 5: 3 epochs after the best (epoch 2)
    assert trainer.stop_training and (hook.best.epoch, hook.best.fitness) == (2, pytest.approx(0.3))


def test_early_stop_never_on_the_last_epoch_and_not_without_patience():
    trainer = _trainer(epochs=2)
    hook = EarlyStopHook(patience=1)
    hook.after_epoch(trainer, _stats(0, 0.3))
    hook.after_epoch(trainer, _stats(1, 0.1))        # worse, but the last epoch: the run ends anyway
    assert not trainer.stop_training
    off, trainer = EarlyStopHook(patience=None), _trainer()
    for epoch in range(5):
        off.after_epoch(trainer, _stats(epoch, 0.1))
    assert not trainer.stop_training and off.best.epoch == 1   # the best is still tracked


def test_early_stop_state_round_trips_and_keeps_counting():
    first = EarlyStopHook(patience=2)
    trainer = _trainer()
    first.after_epoch(trainer, _stats(0, 0.5))
    first.after_epoch(trainer, _stats(1, 0.4))
    resumed = EarlyStopHook(patience=2)
    resumed.load_state_dict(first.state_dict())
    assert resumed.best == first.best
    resumed.after_epoch(trainer, _stats(2, 0.4))   # 2 epochs after the best, across the resume
    assert trainer.stop_training


def test_checkpoint_state_round_trips():
    hook = CheckpointHook()
    hook.best_map = 0.42
    other = CheckpointHook()
    other.load_state_dict(hook.state_dict())
    assert other.best_map == 0.42


def test_old_checkpoints_give_the_hooks_their_state():
    """Files written before the hooks kept their own state: EMA at the top level, best values in ``train``."""
    from ppmulti.rank.engine.checkpoint import TrainState, hook_states

    old = {"model": {}, "ema": {"w": 1}, "ema_step": 7, "rng": None,
           "train": {"epoch": 3, "global_step": 30, "best_map": 0.2, "world_size": 2, "global_batch": 8,
                     "step_in_epoch": 0, "best_fitness": 0.25, "best_epoch": 2}}
    states = hook_states(old)
    assert states["ema"] == {"weights": {"w": 1}, "step": 7}
    assert states["checkpoint"] == {"best_map": 0.2}
    assert states["early_stop"] == {"best_fitness": 0.25, "best_epoch": 2}
    assert TrainState.from_dict(old["train"]) == TrainState(3, 30, 2, 8, 0)
    patience = EarlyStopHook(3)
    patience.load_state_dict(states["early_stop"])
    assert (patience.best.fitness, patience.best.epoch) == (0.25, 2)
    assert hook_states({"hooks": {"checkpoint": {"best_map": 0.5}}, "train": {}}) == {"checkpoint": {"best_map": 0.5}}
    assert hook_states({"train": {}, "ema": None})["ema"] is None


def test_signal_hook_sets_the_flag_on_sigterm_and_restores_the_old_handlers():
    import paddle  # noqa: F401  (its import installs C signal handlers; in a run it comes before before_train)

    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    hook, trainer = StopOnSignalHook(), _trainer()
    hook.before_train(trainer)
    assert signal.getsignal(signal.SIGTERM) != before[signal.SIGTERM]
    hook.after_step(trainer, 0, 0, {}, 0.1, 0.0)
    assert not trainer.stop_training
    os.kill(os.getpid(), signal.SIGTERM)           # noted only: the step finishes
    hook.after_step(trainer, 1, 2, {}, 0.1, 0.0)
    assert trainer.stop_training
    assert (trainer.interrupted.signum, trainer.interrupted.epoch, trainer.interrupted.step) == (signal.SIGTERM, 1, 2)
    with pytest.raises(Interrupted) as exc:
        hook.after_train(trainer)
    assert exc.value.code == 128 + signal.SIGTERM and exc.value.signal_name == "SIGTERM"
    hook.close(trainer)
    assert {sig: signal.getsignal(sig) for sig in before} == before


def test_signal_hook_on_several_ranks_votes_after_optimizer_steps_only(monkeypatch):
    """The micro-steps of an accumulation hold no vote (each would wait for the slowest rank at every batch);
    the stepping batch does, where the gradients' all-reduce has just met every rank."""
    from ppmulti.rank import dist

    votes = []
    monkeypatch.setattr(dist, "world_size", lambda: 2)
    monkeypatch.setattr(dist, "all_reduce_sum", lambda values: votes.append(list(values)) or list(values))
    hook, trainer = StopOnSignalHook(), _trainer(optimizer_stepped=True)
    hook.before_train(trainer)
    try:
        hook.signum = signal.SIGTERM
        for step in range(3):                 # micro-steps: the flag waits
            trainer.optimizer_stepped = False
            hook.after_step(trainer, 0, step, {}, 0.1, 0.0)
        assert votes == [] and not trainer.stop_training
        trainer.optimizer_stepped = True      # the accumulation's last batch
        hook.after_step(trainer, 0, 3, {}, 0.1, 0.0)
        assert votes == [[0.0, 1.0]] and trainer.stop_training
        assert (trainer.interrupted.epoch, trainer.interrupted.step) == (0, 3)
    finally:
        hook.close(trainer)


def test_signal_hook_votes_at_the_epoch_end_but_not_after_the_last_or_an_early_stop():
    hook, trainer = StopOnSignalHook(), _trainer(epochs=3)
    hook.before_train(trainer)
    try:
        hook.signum = signal.SIGINT
        hook.after_epoch(trainer, _stats(2, None))      # the last epoch: the run ends anyway
        assert not trainer.stop_training
        trainer.stop_training = True                    # an early stop: no interruption recorded
        hook.after_epoch(trainer, _stats(1, None))
        assert trainer.interrupted is None
        trainer.stop_training = False
        hook.after_epoch(trainer, _stats(0, None))
        assert trainer.stop_training and trainer.interrupted.step is None
    finally:
        hook.close(trainer)


def test_signal_hook_without_a_signal_lets_after_train_pass():
    hook, trainer = StopOnSignalHook(), _trainer()
    hook.before_train(trainer)
    hook.after_train(trainer)    # no raise
    hook.close(trainer)


def test_hook_points_are_the_hook_methods():
    methods = [n for n, v in vars(Hook).items() if callable(v) and not n.startswith("_")
               and n not in ("state_dict", "load_state_dict")]
    assert methods == list(HOOK_POINTS)


def test_built_in_hooks_run_in_the_documented_order():
    """EMA after the optimizer step, evaluation on the EMA weights, early stop and the checkpoint after it,
    results/plots after that; a user hook after the reporting ones; the signal vote last."""
    user = Hook()
    trainer = toy_trainer(hooks=[StopOnSignalHook(), user, VisualDLHook(), PlotsHook(), ResultsHook(),
                                 CheckpointHook(), ConsoleLogHook(), EarlyStopHook(), EvaluationHook(),
                                 ResumeHook(RunPlan(config="toy.yml")), EMAHook()])
    order = [type(h).__name__ for h in trainer.hooks]
    assert order == ["EMAHook", "ResumeHook", "EvaluationHook", "EarlyStopHook", "ConsoleLogHook", "CheckpointHook",
                     "ResultsHook", "PlotsHook", "VisualDLHook", "Hook", "StopOnSignalHook"]


# ---------------------------------------------------------------- the loop, built from toy parts


def test_the_loop_calls_every_point_in_order_per_epoch_and_step():
    spy = Recorder()
    trainer = toy_trainer(epochs=2, steps=2, hooks=[spy])
    trainer.train()
    per_epoch = lambda e: [("before_epoch", e, None), ("before_step", e, 0), ("after_step", e, 0),  # noqa: E731
                           ("before_step", e, 1), ("after_step", e, 1), ("after_epoch", e, None)]
    assert spy.calls == [("before_train", None, None), *per_epoch(0), *per_epoch(1),
                         ("after_train", None, None), ("close", None, None)]
    assert (trainer.state.epoch, trainer.state.global_step, trainer.state.step_in_epoch) == (2, 4, 0)


def test_hooks_run_by_priority_at_every_point():
    order: list[str] = []
    late, early = Recorder(priority=90, sink=order, tag="late"), Recorder(priority=5, sink=order, tag="early")
    toy_trainer(epochs=1, steps=1, hooks=[late, early]).train()
    assert order == ["early", "late"] * 7   # 7 calls each: train, epoch, step, step, epoch, train, close


def test_the_loop_trains_the_model_and_steps_the_lr_schedule():
    import paddle

    lrs, losses = [], []

    class Watch(Hook):
        def after_step(self, trainer, epoch, step, outputs, lr, data_time):
            lrs.append(lr)
            losses.append(outputs.losses()["loss"])

    schedule = paddle.optimizer.lr.StepDecay(learning_rate=0.1, step_size=4, gamma=0.5)
    trainer = toy_trainer(epochs=3, steps=4, hooks=[Watch()], schedule=schedule)
    before = trainer.model.linear.weight.numpy().copy()
    metrics = trainer.train()
    assert lrs == [0.1] * 4 + [0.05] * 4 + [0.025] * 4          # the lr each step used; stepped after it
    assert sum(losses[-4:]) < 0.5 * sum(losses[:4])            # SGD on a linear target: the loss falls
    assert (trainer.model.linear.weight.numpy() != before).all()
    assert metrics == {"epochs": 3, "world_size": 1, "global_batch": 1, "accumulate": 1,
                       "effective_batch": 1, "run_dir": None}


def test_stop_training_in_after_step_ends_the_loop_at_that_step():
    class StopAt(Hook):
        def after_step(self, trainer, epoch, step, outputs, lr, data_time):
            if (epoch, step) == (1, 1):
                trainer.stop_training = True

    spy = Recorder()
    trainer = toy_trainer(epochs=4, steps=4, hooks=[StopAt(), spy])
    trainer.train()
    points = [c for c in spy.calls if c[0] in ("after_step", "after_epoch", "after_train", "close")]
    assert points[-5:] == [("after_epoch", 0, None), ("after_step", 1, 0), ("after_step", 1, 1),
                           ("after_train", None, None), ("close", None, None)]   # no after_epoch for epoch 1
    assert (trainer.state.epoch, trainer.state.global_step, trainer.state.step_in_epoch) == (1, 6, 2)


def test_close_runs_when_a_hook_raises():
    class Crash(Hook):
        def after_step(self, trainer, epoch, step, outputs, lr, data_time):
            raise RuntimeError("boom")

    spy = Recorder()
    with pytest.raises(RuntimeError, match="boom"):
        toy_trainer(hooks=[Crash(), spy]).train()
    assert spy.calls[-1] == ("close", None, None) and ("after_train", None, None) not in spy.calls


def test_evaluation_runs_on_validated_snapshot_epochs_and_always_the_last():
    quiet = ScriptedEvaluation([0.1] * 9)
    toy_trainer(epochs=4, steps=1, hooks=[quiet]).train()
    assert quiet.evaluated_epochs == [4]                       # without --eval: the last epoch only
    every_2nd = ScriptedEvaluation([0.1] * 9)
    toy_trainer(epochs=5, steps=1, hooks=[every_2nd], cfg={"snapshot_epoch": 2}, validate=True).train()
    assert every_2nd.evaluated_epochs == [2, 4, 5]


def test_early_stop_hook_ends_a_toy_run_and_the_last_metrics_are_the_stopped_epoch():
    spy = Recorder()
    trainer = toy_trainer(epochs=8, steps=2, validate=True,
                          hooks=[ScriptedEvaluation([0.3, 0.5, 0.4, 0.45, 0.2, 0.9]), EarlyStopHook(patience=2), spy])
    metrics = trainer.train()
    # best at epoch 2; epochs 3 and 4 are no better: stop after epoch 4, before epoch 5 starts
    assert [c[1] for c in spy.calls if c[0] == "after_epoch"] == [0, 1, 2, 3]
    assert trainer.state.epoch == 4 and metrics["epochs"] == 4 and metrics["mAP50_95"] == 0.45


def test_resume_state_is_the_file_paddle_save_writes(tmp_path):
    """save_nested (the .pdstate writer) pickles as paddle.save does: paddle.load gives the same nested state back,
    tensors with their names and values (a model's, AdamW's, an EMA's), and everything else as it was."""
    import numpy as np
    import paddle

    from ppmulti.rank.engine.checkpoint import save_nested

    model = paddle.nn.Sequential(paddle.nn.Conv2D(3, 4, 3), paddle.nn.BatchNorm2D(4))
    adamw = paddle.optimizer.AdamW(learning_rate=1e-3, parameters=model.parameters())
    model(paddle.rand([2, 3, 8, 8])).mean().backward()
    adamw.step()
    payload = {"model": model.state_dict(), "optimizer": adamw.state_dict(),
               "hooks": {"ema": {"weights": {k: v.clone() for k, v in model.state_dict().items()}, "updates": 1}},
               "rng": {"numpy": np.random.get_state()}, "train": {"epoch": 1}, "pair": ("name", 3)}
    paddle.save(payload, str(tmp_path / "paddle.pdstate"))
    save_nested(payload, str(tmp_path / "ours.pdstate"))
    theirs, ours = paddle.load(str(tmp_path / "paddle.pdstate")), paddle.load(str(tmp_path / "ours.pdstate"))

    tensors = []

    def same(a, b, where):
        assert type(a) is type(b), where
        if isinstance(a, dict):
            assert list(a) == list(b), where
            for k in a:
                same(a[k], b[k], f"{where}/{k}")
        elif isinstance(a, (list, tuple)):
            assert len(a) == len(b), where
            for i, (x, y) in enumerate(zip(a, b)):
                same(x, y, f"{where}[{i}]")
        elif isinstance(a, paddle.Tensor):
            assert a.name == b.name and a.dtype == b.dtype and (a.numpy() == b.numpy()).all(), where
            tensors.append(where)
        elif isinstance(a, np.ndarray):
            assert (a == b).all(), where
        else:
            assert a == b, where

    same(theirs, ours, "")
    assert any(t.startswith("/optimizer/") for t in tensors) and any(t.startswith("/hooks/ema") for t in tensors)


def test_checkpoint_hook_writes_last_and_best_atomically(tmp_path):
    import paddle

    from ppmulti.rank.engine.checkpoint import Progress, load_state, read_progress

    ckpt_hook = CheckpointHook()
    trainer = toy_trainer(epochs=3, steps=2, run_dir=tmp_path, validate=True,
                          hooks=[ScriptedEvaluation([0.2, 0.5, 0.3]), ckpt_hook])
    trainer.train()
    weights = tmp_path / "weights"
    assert sorted(p.name for p in weights.iterdir()) == ["best.json", "best.pdparams", "best.pdstate", "last.json",
                                                         "last.pdparams", "last.pdstate"]   # no temp file left
    last, best = load_state(weights / "last.pdstate"), load_state(weights / "best.pdstate")
    assert last["train"]["epoch"] == 3 and best["train"]["epoch"] == 2       # best: the 0.5 of epoch 2
    # each state's sidecar, read without Paddle by a later --resume's launching process (no ResumeHook: no plan)
    assert read_progress(weights / "last.pdstate") == Progress(3, False, None)
    assert read_progress(weights / "best.pdstate") == Progress(2, False, None)
    assert best["hooks"]["checkpoint"] == {"best_map": 0.5} and ckpt_hook.best_map == 0.5 == trainer.best_map
    saved = paddle.load(str(weights / "last.pdparams"))
    assert all((saved[k].numpy() == v.numpy()).all() for k, v in trainer.model.state_dict().items())

    # a save that fails half-way leaves the previous file whole and no temp file
    before = (weights / "last.pdparams").read_bytes()
    real_pickle = ckpt_mod._pickle

    def broken(obj, path):
        with open(path, "wb") as f:
            f.write(b"half")
        raise OSError("disk full")

    ckpt_mod._pickle = broken
    try:
        with pytest.raises(OSError, match="disk full"):
            trainer.save_checkpoint("last")
    finally:
        ckpt_mod._pickle = real_pickle
    assert (weights / "last.pdparams").read_bytes() == before
    assert not [p for p in weights.iterdir() if p.suffix == ".tmp"]


def test_an_epochs_checkpoint_is_written_while_the_next_epoch_trains(tmp_path, monkeypatch):
    """The checkpoint hook copies the state between two steps and writes its files in a thread of its own: the
    files hold the state of the moment it was copied, not of the steps after it; a failed write is raised in the
    training thread (at the end of the run here), and leaves the previous files whole."""
    import threading

    import paddle

    from ppmulti.rank.engine.checkpoint import load_state

    released = threading.Event()
    seen: dict = {}
    real_pickle = ckpt_mod._pickle

    def slow(obj, path):   # epoch 1's write waits until a step of epoch 2 has changed the weights
        if path.startswith(str(tmp_path / "weights" / ".last.pdparams")) and "first" not in seen:
            seen["first"] = threading.current_thread().name
            assert released.wait(30)
        real_pickle(obj, path)

    class Epoch2Step(Hook):
        reads_weights = False   # else epoch 1's after_epoch would wait here for the write this hook releases

        def after_step(self, trainer, epoch, step, outputs, lr, data_time):
            if epoch == 1 and step == 1:
                seen["weights"] = {k: v.numpy().copy() for k, v in trainer.model.state_dict().items()}
                released.set()

    class Epoch1Weights(Hook):
        priority = 59   # just before the checkpoint hook: the weights it copies
        def after_epoch(self, trainer, stats):
            if stats.epoch == 0:
                seen["epoch1"] = {k: v.numpy().copy() for k, v in trainer.model.state_dict().items()}

    monkeypatch.setattr(ckpt_mod, "_pickle", slow)
    trainer = toy_trainer(epochs=2, steps=2, run_dir=tmp_path, hooks=[CheckpointHook(), Epoch2Step(), Epoch1Weights()])
    real_run = trainer.run_epoch

    def run_epoch(epoch):   # look at the files when epoch 2 ends, before its own save
        stats = real_run(epoch)
        if epoch == 1:
            trainer.wait_for_checkpoints()
            seen["file"] = paddle.load(str(tmp_path / "weights" / "last.pdparams"))
            seen["state"] = load_state(tmp_path / "weights" / "last.pdstate")
        return stats

    trainer.run_epoch = run_epoch
    trainer.train()
    assert seen["first"] == "ppmulti-checkpoint"   # written off the training thread
    assert seen["state"]["train"]["epoch"] == 1
    changed = [k for k in seen["epoch1"] if not (seen["epoch1"][k] == seen["weights"][k]).all()]
    assert changed   # epoch 2's steps changed weights while epoch 1's file was being written ...
    for k, v in seen["epoch1"].items():   # ... and the file holds epoch 1's
        assert (seen["file"][k].numpy() == v).all(), k

    # a background write that fails: raised by the run, the files before it whole, no temp file left
    before = (tmp_path / "weights" / "last.pdparams").read_bytes()

    def broken(obj, path):
        raise OSError("disk full")

    monkeypatch.setattr(ckpt_mod, "_pickle", broken)
    again = toy_trainer(epochs=1, steps=2, run_dir=tmp_path, hooks=[CheckpointHook()])
    with pytest.raises(OSError, match="disk full"):
        again.train()
    assert (tmp_path / "weights" / "last.pdparams").read_bytes() == before
    assert not [p for p in (tmp_path / "weights").iterdir() if p.suffix == ".tmp"]
    assert not [t for t in threading.enumerate() if t.name == "ppmulti-checkpoint"]


def test_the_weights_file_is_paddle_saves_byte_for_byte(tmp_path):
    """weights_layout pickled (what a checkpoint's .pdparams holds) is the file paddle.save writes for the same
    state dict, on this Paddle: PaddleDetection's and Paddle's loaders read it as their own."""
    import paddle

    from ppmulti.rank.engine.checkpoint import _pickle, weights_layout

    model = paddle.nn.Sequential(paddle.nn.Conv2D(3, 4, 3), paddle.nn.BatchNorm2D(4), paddle.nn.Linear(6, 2))
    paddle.save(model.state_dict(), str(tmp_path / "paddle.pdparams"))
    _pickle(weights_layout(model.state_dict()), str(tmp_path / "ours.pdparams"))
    assert (tmp_path / "ours.pdparams").read_bytes() == (tmp_path / "paddle.pdparams").read_bytes()


def test_load_weights_reads_the_models_keys_once_and_skips_the_unexpected(tmp_path):
    """Eval, infer and export load weights here: the model's state_dict() walks every sublayer, so it is taken once,
    not once per weight (HGNetv2-X's 1,070 weights took 47 s to load on Paddle 2.6.2 that way)."""
    import paddle

    from ppmulti.rank.engine.checkpoint import load_weights

    paddle.seed(0)
    source, model = (paddle.nn.Sequential(*[paddle.nn.Linear(3, 3) for _ in range(40)]) for _ in range(2))
    weights = {**source.state_dict(), "head.extra": paddle.ones([2])}
    paddle.save(weights, str(tmp_path / "w.pdparams"))
    calls = []
    own = model.state_dict

    def counted(*a, **kw):
        calls.append(1)
        return own(*a, **kw)

    model.state_dict = counted
    missing, unexpected = load_weights(model, tmp_path / "w")
    assert (missing, unexpected) == ([], ["head.extra"])
    assert len(calls) <= 2, len(calls)   # 82 before: one for the shapes, then one per weight
    assert all((own()[k].numpy() == v.numpy()).all() for k, v in source.state_dict().items())


def test_checkpoint_hook_nosave_and_save_period(tmp_path):
    toy_trainer(epochs=4, steps=1, run_dir=tmp_path / "periodic", save_period=2, hooks=[CheckpointHook()]).train()
    assert sorted(p.name for p in (tmp_path / "periodic/weights").glob("*.pdparams")) == [
        "best.pdparams", "epoch2.pdparams", "epoch4.pdparams", "last.pdparams"]
    seen = []

    class Look(Hook):
        priority = 65   # right after the checkpoint hook (60)

        def after_epoch(self, trainer, stats):
            seen.append((trainer.run_dir / "weights" / "last.pdparams").is_file())

    toy_trainer(epochs=3, steps=1, run_dir=tmp_path / "nosave", nosave=True, hooks=[CheckpointHook(), Look()]).train()
    assert seen == [False, False, True]   # --nosave: the final epoch only


def test_a_resumed_toy_run_ends_with_the_weights_of_an_uninterrupted_one(tmp_path):
    whole = toy_trainer(epochs=3, steps=3)
    whole.train()
    first = toy_trainer(epochs=2, steps=3, run_dir=tmp_path, hooks=[CheckpointHook()])
    first.train()
    resume = ResumeHook(RunPlan(config="toy.yml", resume=str(tmp_path)))
    spy = Recorder()
    again = toy_trainer(epochs=3, steps=3, run_dir=tmp_path, hooks=[resume, CheckpointHook(), spy], seed=1)
    again.train()
    assert [c[1] for c in spy.calls if c[0] == "before_epoch"] == [2]      # only the epoch not yet done
    assert again.state.global_step == 9
    for key, value in whole.model.state_dict().items():
        assert abs(again.model.state_dict()[key].numpy() - value.numpy()).max() < 1e-6, key


def test_a_signal_mid_epoch_saves_and_the_resume_skips_the_steps_done(tmp_path):
    import paddle  # noqa: F401  (its import installs C signal handlers; in a run it comes before before_train)

    class Kill(Hook):
        def after_step(self, trainer, epoch, step, outputs, lr, data_time):
            if (epoch, step) == (1, 1):
                os.kill(os.getpid(), signal.SIGTERM)

    with pytest.raises(Interrupted) as exc:
        toy_trainer(epochs=3, steps=4, run_dir=tmp_path, hooks=[Kill(), CheckpointHook(), StopOnSignalHook()]).train()
    assert exc.value.code == 128 + signal.SIGTERM
    from ppmulti.rank.engine.checkpoint import load_state

    train = load_state(tmp_path / "weights" / "last.pdstate")["train"]
    assert (train["epoch"], train["step_in_epoch"], train["global_step"]) == (1, 2, 6)
    spy = Recorder()
    again = toy_trainer(epochs=3, steps=4, run_dir=tmp_path, hooks=[
        ResumeHook(RunPlan(config="toy.yml", resume=str(tmp_path))), spy])
    again.train()
    assert [(c[1], c[2]) for c in spy.calls if c[0] == "after_step"][:3] == [(1, 2), (1, 3), (2, 0)]
    assert again.state.global_step == 12


def test_results_hook_writes_a_row_per_epoch_and_metrics_json(tmp_path):
    import csv
    import json

    trainer = toy_trainer(epochs=2, steps=2, run_dir=tmp_path, hooks=[ScriptedEvaluation([0.4]), CheckpointHook(),
                                                                      ResultsHook()])
    trainer.train()
    rows = list(csv.DictReader(open(tmp_path / "results.csv")))
    assert [r["epoch"] for r in rows] == ["1", "2"] and rows[0]["mAP50"] == "" and rows[1]["mAP50_95"] == "0.40000"
    assert float(rows[1]["loss"]) < float(rows[0]["loss"])
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert (metrics["mAP50_95"], metrics["best_mAP50_95"], metrics["epochs"]) == (0.4, 0.4, 2)


def test_reporting_hooks_come_by_default_only_as_the_builder_asks_and_only_when_none_were_registered(tmp_path):
    plain = toy_trainer(epochs=1, steps=1)
    plain.train()
    assert plain.hooks == []                      # from parts: the hooks given, nothing more
    chosen = toy_trainer(epochs=1, steps=1, run_dir=tmp_path / "chosen", report_by_default=True)
    chosen.register(Recorder())
    chosen.train()
    assert [type(h).__name__ for h in chosen.hooks] == ["Recorder"]
    built = toy_trainer(epochs=1, steps=1, run_dir=tmp_path / "built", report_by_default=True, noplots=True)
    built.train()
    assert [type(h).__name__ for h in built.hooks] == ["ConsoleLogHook", "ResultsHook", "TrackersHook"]
    assert (tmp_path / "built/results.csv").is_file() and (tmp_path / "built/metrics.json").is_file()
    assert list((tmp_path / "built/vdl").iterdir())


def test_ema_hook_averages_a_toy_run_and_its_weights_are_the_ones_saved(tmp_path):
    import paddle

    from ppmulti.rank.engine.checkpoint import load_state

    ema = EMAHook()
    trainer = toy_trainer(epochs=2, steps=3, run_dir=tmp_path, cfg={"use_ema": True, "ema_decay": 0.5},
                          hooks=[ema, CheckpointHook()])
    trainer.train()
    assert trainer.ema is ema.ema and ema.ema.step == 6                  # one update per optimizer step
    shipped = paddle.load(str(tmp_path / "weights" / "last.pdparams"))
    raw = trainer.model.state_dict()
    gap = abs(shipped["linear.weight"].numpy() - raw["linear.weight"].numpy()).max()
    assert gap > 1e-4                                                  # the average lags the trained weights
    saved = load_state(tmp_path / "weights" / "last.pdstate")["hooks"]["ema"]
    assert saved["step"] == 6 and set(saved["weights"]) == set(raw)


def test_an_epochs_evaluation_and_checkpoint_share_one_ema_apply(tmp_path, monkeypatch):
    """ppdet's ModelEMA.apply() counts epochs for ``cycle_epoch`` (the average restarts there) and its trainer
    applies once per snapshot epoch. An epoch's evaluation and checkpoint share one apply: the weights scored are
    the weights saved, and with cycle_epoch 2 the average restarts every 2 epochs, not every one."""
    import paddle

    class Scoring(ScriptedEvaluation):
        def evaluate(self, trainer):
            self.scored = trainer.inference_weights()["linear.weight"].numpy().copy()
            return super().evaluate(trainer)

    ema, scoring = EMAHook(), Scoring([0.1, 0.2, 0.3, 0.4])
    trainer = toy_trainer(epochs=4, steps=3, run_dir=tmp_path, validate=True, hooks=[ema, scoring, CheckpointHook()],
                          cfg={"use_ema": True, "ema_decay": 0.5, "cycle_epoch": 2})
    from ppdet.optimizer import ModelEMA

    applies, real_apply = [], ModelEMA.apply
    monkeypatch.setattr(ModelEMA, "apply", lambda self: applies.append(self.step) or real_apply(self))
    trainer.train()
    assert applies == [3, 6, 3, 6]   # one per epoch (3 steps each), the average restarted after the 2nd epoch
    assert ema.ema.step == 0         # and after the 4th (two applies per epoch restarted it after the 1st, ...)
    trainer.wait_for_checkpoints()
    shipped = paddle.load(str(tmp_path / "weights" / "last.pdparams"))["linear.weight"].numpy()
    assert (shipped == scoring.scored).all()
