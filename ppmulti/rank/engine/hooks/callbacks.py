"""Users' callbacks (``--callback EVENT=module:function``) called in every rank at ultralytics' training events,
with a view of the run (``trainer.epoch``, ``trainer.metrics``, ``trainer.rank`` ...)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from ppmulti.common.callbacks import EVENTS, CallbackSpec, resolve
from ppmulti.rank.engine.hooks.base import Hook, host_losses


class RunView:
    """What a callback receives: ultralytics' trainer attributes that have a meaning here, read from the run."""

    def __init__(self, trainer, event: str):
        self._trainer = trainer
        self.event = event
        self.rank = trainer.rank                 # ultralytics' RANK: 0 on the rank that logs and saves
        self.world_size = trainer.world
        self.epochs = int(trainer.cfg.get("epoch", 0))
        self.epoch = trainer.state.epoch         # 0-based, as ultralytics' trainer.epoch
        self.save_dir = None if trainer.run_dir is None else Path(trainer.run_dir)
        self.wdir = None if self.save_dir is None else self.save_dir / "weights"
        self.last = None if self.wdir is None else self.wdir / "last.pdparams"
        self.best = None if self.wdir is None else self.wdir / "best.pdparams"
        self.metrics: dict = dict(trainer.last_metrics or {})
        self.loss_items: dict[str, float] = {}
        self.step: int | None = None
        self.stop = False                        # set True to stop the run after this moment, as ultralytics'

    @property
    def model(self):
        return self._trainer.model

    @property
    def optimizer(self):
        return self._trainer.optimizer


class CallbacksHook(Hook):
    """One moment's order (early: before evaluation and checkpoints; late: after every built-in hook)."""

    def __init__(self, specs: list[CallbackSpec], order: str):
        self.specs = [s for s in specs if EVENTS[s.event][1] == order]
        self.priority = 25 if order == "early" else 97   # evaluation is 30; the stop-on-signal vote is 100
        self._funcs: dict[str, list[tuple[str, Callable[..., Any]]]] = {}

    @property
    def reads_weights(self) -> bool:   # on_model_save / on_fit_epoch_end may read the epoch's weights files
        return bool(self._funcs.get("after_epoch"))

    def _call(self, trainer, point: str, **extra) -> None:
        for event, func in self._funcs.get(point, []):
            view = RunView(trainer, event)
            for key, value in extra.items():
                setattr(view, key, value)
            func(view)
            if view.stop:
                trainer.stop_training = True

    def before_train(self, trainer) -> None:
        for spec in self.specs:   # imported in this rank, once
            self._funcs.setdefault(EVENTS[spec.event][0], []).append((spec.event, resolve(spec)))
        self._call(trainer, "before_train")

    def before_epoch(self, trainer, epoch: int) -> None:
        self._call(trainer, "before_epoch", epoch=epoch)

    def before_step(self, trainer, epoch: int, step: int) -> None:
        self._call(trainer, "before_step", epoch=epoch, step=step)

    def after_step(self, trainer, epoch: int, step: int, outputs: dict, lr: float, data_time: float) -> None:
        if "after_step" in self._funcs:   # the losses reach the host only for a callback that reads them
            self._call(trainer, "after_step", epoch=epoch, step=step, loss_items=host_losses(outputs), lr=lr)

    def after_epoch(self, trainer, stats) -> None:
        self._call(trainer, "after_epoch", epoch=stats.epoch, loss_items=dict(stats.losses),
                   metrics=dict(stats.metrics or trainer.last_metrics or {}))

    def after_train(self, trainer) -> None:
        self._call(trainer, "after_train")

    def close(self, trainer) -> None:
        self._call(trainer, "close")
