"""Writing checkpoints: weights/last every snapshot epoch, weights/best on a better mAP, weights/epochN, on a stop;
a PaddleDetection config's run also ends with model_final.pdparams, as PaddleDetection's trainer writes it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ppmulti.rank import dist
from ppmulti.rank.engine.hooks.base import Hook


class CheckpointHook(Hook):
    """Rank 0 writes ``weights/last`` every snapshot epoch and copies it to ``weights/best`` on a new best (in the
    background: the state is copied between two steps and its files written while the next epoch trains);
    ``--nosave`` keeps only the final save, ``--save-period N`` also keeps ``weights/epochN`` every N epochs.
    A run stopped by a signal is saved as ``weights/last`` with its interrupted epoch, for ``--resume``.
    Its state in a checkpoint: the mAP50-95 of ``weights/best`` (-1: none yet)."""

    priority = 60   # after evaluation (the best weights) and early stop (the final save)
    name = "checkpoint"

    def __init__(self) -> None:
        self.best_map = -1.0

    def after_epoch(self, trainer, stats) -> None:
        epoch = stats.epoch + 1
        final = epoch == int(trainer.cfg["epoch"]) or trainer.stop_training
        snapshot = max(1, int(trainer.cfg.get("snapshot_epoch", 1)))
        period = int(getattr(trainer.opts, "save_period", -1) or -1)
        periodic = period > 0 and epoch % period == 0
        if getattr(trainer.opts, "nosave", False):
            due = final
        else:
            due = final or epoch % snapshot == 0 or periodic
        if not due or not dist.is_main():
            return
        from ppmulti.rank.engine.checkpoint import WEIGHTS, copy_checkpoint

        score = stats.metrics["mAP50_95"] if stats.metrics else None
        is_best = score is not None and score > self.best_map
        if is_best:
            self.best_map = score
        snap = trainer.checkpoint_snapshot("last")   # the next step may change the weights from here on

        def publish() -> None:   # in the background while the next epoch trains (trainer.checkpoints)
            snap.write()
            stem = Path(snap.stem)
            best = stem.parent / "best"
            if is_best or not (best.parent / ("best" + WEIGHTS)).exists():
                copy_checkpoint(stem, best)
            if periodic:
                copy_checkpoint(stem, stem.parent / f"epoch{epoch}", state=False)

        trainer.checkpoints.submit(publish)

    def after_train(self, trainer) -> None:
        trainer.wait_for_checkpoints()   # the epoch's files before a stop's save, model_final and the pictures
        stop = getattr(trainer, "interrupted", None)
        if stop is not None and dist.is_main():
            stop.checkpoint = trainer.save_checkpoint("last")
        elif dist.is_main() and trainer.run_dir is not None and trainer.opts.config and trainer.opts.record is None:
            # a PaddleDetection config's command line (YOLOv5's keeps a record; a Trainer from parts has no config)
            write_model_final(trainer.run_dir)

    def state_dict(self) -> dict[str, Any]:
        return {"best_map": self.best_map}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.best_map = float(state.get("best_map", -1.0))


FINAL = "model_final"   # PaddleDetection's name for the weights a training ends with (ppdet/engine/trainer.py)


def write_model_final(run_dir) -> None:
    """``run_dir/model_final.pdparams``: the final ``weights/last`` weights (EMA's when on, as PaddleDetection's
    trainer saves them), where a PaddleDetection user's ``-o weights=output/CONFIG/model_final`` finds them. Only a
    run that finished writes it (a stopped one resumes from weights/last); YOLOv5-style runs keep YOLOv5's files."""
    from ppmulti.rank.engine.checkpoint import WEIGHTS, copy_checkpoint

    last = Path(run_dir) / "weights" / "last"
    if Path(str(last) + WEIGHTS).is_file():
        copy_checkpoint(last, Path(run_dir) / FINAL, state=False)
