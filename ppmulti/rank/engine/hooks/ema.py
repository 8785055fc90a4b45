"""The exponential moving average of the weights (ppdet's ModelEMA): built, updated each optimizer step, saved,
resumed."""

from __future__ import annotations

from typing import Any

from ppmulti.rank.engine.hooks.base import Hook


class EMAHook(Hook):
    """With ``use_ema`` in the config, keeps ppdet's ``ModelEMA`` of the model and offers it as
    ``trainer.ema`` (what ``Trainer.inference_weights`` evaluates and ships). Its state in a checkpoint:
    the averaged weights and the update count (the count sets the decay warm-up)."""

    priority = 10   # first after the optimizer step; before resume, which needs the EMA to exist
    name = "ema"

    def __init__(self) -> None:
        self.ema = None

    def before_train(self, trainer) -> None:
        cfg = trainer.cfg
        if not cfg.get("use_ema", False):
            trainer.ema = None
            return
        from ppmulti.rank import compat

        self.ema = compat.model_ema(trainer.model, decay=cfg.get("ema_decay", 0.9998),
                                    ema_decay_type=cfg.get("ema_decay_type", "threshold"),
                                    cycle_epoch=cfg.get("cycle_epoch", -1),
                                    ema_black_list=cfg.get("ema_black_list", None),
                                    ema_filter_no_grad=cfg.get("ema_filter_no_grad", False))
        trainer.ema = self.ema

    def after_step(self, trainer, epoch, step, outputs, lr, data_time) -> None:
        # after optimizer steps only (YOLOv5's order): a micro-step of an accumulation left the weights unchanged
        if self.ema is not None and getattr(trainer, "optimizer_stepped", True):
            self.ema.update()

    def state_dict(self) -> dict[str, Any] | None:
        if self.ema is None:
            return None
        return {"weights": dict(self.ema.state_dict), "step": self.ema.step}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.ema is not None and state.get("weights"):
            self.ema.resume(state["weights"], state.get("step", 0))
