"""Early stop (``--patience N``): track the best fitness, stop after N evaluated epochs without a better one."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from ppmulti.common.metrics import fitness
from ppmulti.rank.engine.hooks.base import Hook

log = logging.getLogger("ppmulti")


@dataclass
class BestFitness:
    fitness: float = -1.0   # 0.1 mAP50 + 0.9 mAP50-95 of the best evaluated epoch
    epoch: int = 0          # that epoch (1-based; 0 = none yet)


class EarlyStopHook(Hook):
    """On every evaluated epoch, keeps the best fitness; with ``patience`` set, sets ``trainer.stop_training``
    once ``patience`` epochs passed without a better one (never on the last epoch: that one ends anyway).
    Its state in a checkpoint: the best fitness and its epoch, so a resumed run keeps counting."""

    priority = 40   # needs this epoch's metrics (evaluation); the checkpoint after it sees the stop
    name = "early_stop"

    def __init__(self, patience: int | None = None) -> None:
        self.patience = patience
        self.best = BestFitness()

    def after_epoch(self, trainer, stats) -> None:
        if not stats.metrics:
            return
        done = stats.epoch + 1
        score = fitness(stats.metrics)
        if score > self.best.fitness:
            self.best = BestFitness(score, done)
        waited = done - self.best.epoch
        if self.patience and waited >= self.patience and done < int(trainer.cfg["epoch"]):
            trainer.stop_training = True
            log.warning("stopping early after epoch %d: no better fitness for %d epochs (best %.4f at epoch %d; "
                        "--patience %d)", done, waited, self.best.fitness, self.best.epoch, self.patience)

    def state_dict(self) -> dict[str, Any]:
        return {"best_fitness": self.best.fitness, "best_epoch": self.best.epoch}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.best = BestFitness(float(state.get("best_fitness", -1.0)), int(state.get("best_epoch", 0)))
