"""The loop's hooks one at a time, without a model: early stop, stop on a signal, checkpoint state, order."""

from __future__ import annotations

import os
import signal
from types import SimpleNamespace

import pytest

from ppmulti.rank.engine.hooks import (HOOK_POINTS, CheckpointHook, ConsoleLogHook, EarlyStopHook, EMAHook,
                                       EvaluationHook, Hook, Interrupted, PlotsHook, ResultsHook, ResumeHook,
                                       StopOnSignalHook, VisualDLHook)


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
    from ppmulti.rank.engine.trainer import Trainer

    trainer = Trainer.__new__(Trainer)
    trainer.hooks = []
    user = Hook()
    trainer._add(StopOnSignalHook(), user, VisualDLHook(), PlotsHook(), ResultsHook(), CheckpointHook(),
                 ConsoleLogHook(), EarlyStopHook(), EvaluationHook(), ResumeHook.__new__(ResumeHook), EMAHook())
    order = [type(h).__name__ for h in trainer.hooks]
    assert order == ["EMAHook", "ResumeHook", "EvaluationHook", "EarlyStopHook", "ConsoleLogHook", "CheckpointHook",
                     "ResultsHook", "PlotsHook", "VisualDLHook", "Hook", "StopOnSignalHook"]


def test_the_loop_calls_the_points_in_order_and_stops_on_the_flag():
    """train() with a stand-in epoch: before_train, per epoch before/after_epoch, after_train, close; a hook
    that sets stop_training ends it after that epoch."""
    from ppmulti.rank.engine.trainer import Trainer

    calls = []

    class Spy(Hook):
        def __getattribute__(self, name):
            if name in HOOK_POINTS:
                return lambda trainer, *a: calls.append((name, getattr(a[0], "epoch", a[0])) if a else name)
            return object.__getattribute__(self, name)

    class StopAfterSecond(Hook):
        def after_epoch(self, trainer, stats):
            if stats.epoch == 1:
                trainer.stop_training = True

    trainer = Trainer.__new__(Trainer)
    trainer.hooks, trainer._hooks_chosen, trainer.stop_training = [], True, False
    trainer.cfg, trainer.state = {"epoch": 5}, SimpleNamespace(epoch=0)
    trainer._log_plan = lambda: None
    trainer.run_epoch = lambda epoch: SimpleNamespace(epoch=epoch)
    trainer.last_metrics, trainer.world, trainer.batch, trainer.run_dir = None, 1, SimpleNamespace(global_batch=8), "r"
    trainer.register(Spy(), StopAfterSecond())
    trainer.train()
    assert calls == ["before_train", ("before_epoch", 0), ("after_epoch", 0), ("before_epoch", 1),
                     ("after_epoch", 1), "after_train", "close"]
