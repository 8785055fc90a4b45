"""Evaluation on the val split (with the EMA weights when EMA is on) every snapshot epoch and after the last."""

from __future__ import annotations

import logging

from ppmulti.rank.engine.hooks.base import Hook

log = logging.getLogger("ppmulti")


class EvaluationHook(Hook):
    """Scores the model with the config's metric (COCO or VOC mAP) when ``--eval`` asks for it every
    ``snapshot_epoch`` epochs, and always after the last epoch; fills ``stats.metrics`` (and rank 0's
    ``stats.pr_curve``) for the hooks after it and keeps ``trainer.last_metrics`` for metrics.json. No state of
    its own to resume."""

    priority = 30   # after the EMA update, before early stop and the checkpoint that keeps the best weights

    def __init__(self) -> None:
        self.evaluator = None   # built on first use: a run without --eval builds its loader once, at the end

    def after_epoch(self, trainer, stats) -> None:
        epochs = int(trainer.cfg["epoch"])
        snapshot = max(1, int(trainer.cfg.get("snapshot_epoch", 1)))
        last = stats.epoch + 1 == epochs
        if not ((trainer.opts.validate and (stats.epoch + 1) % snapshot == 0) or last):
            return
        self.table = "classes" if last else "all"   # YOLOv5 prints every class's row after the last epoch
        result = self.evaluate(trainer)
        self.table_done = last
        stats.metrics = result.as_dict()
        stats.pr_curve = self.evaluator.last_pr
        trainer.last_metrics = stats.metrics
        trainer.class_maps = getattr(result, "class_maps", None)   # per-class mAP50-95 (--image-weights)
        trainer.last_diagnostics = getattr(self.evaluator, "last_diagnostics", None)   # rank 0 (PlotsHook)
        trainer.last_val_batches = getattr(self.evaluator, "last_val_batches", None)

    def after_train(self, trainer) -> None:
        """A run stopped early (--patience) ends with the per-class table of its last evaluation too."""
        diag = getattr(self.evaluator, "last_diagnostics", None)
        if diag is not None and not getattr(self, "table_done", True):
            from ppmulti.rank.engine.evaluator import _say

            _say(diag.table(per_class=len(diag.names) > 1))

    def close(self, trainer) -> None:
        """However the run ends, the eval loader's workers end with it."""
        if self.evaluator is not None:
            self.evaluator.close()

    def evaluate(self, trainer):
        """Score the inference weights (EMA's when on) and put the trained weights back; rank 0 prints YOLOv5's
        table as ``self.table`` asks (CocoEvaluator.table)."""
        from ppmulti.rank.engine.evaluator import make_evaluator

        if self.evaluator is None:
            if getattr(trainer.opts, "val_rect", False):
                # ultralytics' trainer validates in batches of twice each rank's training batch, each rank its own
                # contiguous batches (BaseTrainer._build_train_pipeline): the rect shapes come per such batch
                val_rect(trainer.cfg, 2 * trainer.batch.per_rank)
            self.evaluator = make_evaluator(trainer.cfg, worker_num=trainer.cfg.get("worker_num", 0))
        self.evaluator.table = getattr(self, "table", "all")
        self.evaluator.keep_batches = 0 if getattr(trainer.opts, "noplots", False) else 3   # val_batch*.jpg
        model = trainer.model
        raw = None
        if getattr(trainer, "ema", None) is not None:
            raw = {k: v.detach().clone() for k, v in model.state_dict().items()}   # a fifth of deepcopy's time
            model.set_dict(trainer.inference_weights())
        if getattr(trainer, "world", 1) > 1:
            rank0_statistics(model)
        previous = pick_head(model, getattr(trainer.opts, "val_end2end", None))
        try:
            return self.evaluator.evaluate(model)
        finally:
            if previous is not None:
                model.head.end2end = previous
            if raw is not None:
                model.set_dict(raw)
            model.train()


def val_rect(cfg, batch: int | None = None) -> bool:
    """The run's plan asks for ultralytics' val letterbox (rect batches of ``batch`` images, else the EvalReader's
    batch_size) while training: applied to the config's EvalReader and EvalDataset once the run's config.yml is
    written (that file keeps the config's own letterbox, which `ppmulti yolo val` swaps as it does here);
    YOLOv8/11/26 only, other models and data as they are, said once. Returns whether it applied."""
    from ppmulti.rank.yolo_config import apply_val_rect

    problem = apply_val_rect(cfg, batch)
    if problem is not None:
        log.warning("validation letterbox: square, not ultralytics' rect batches: %s", problem)
    return problem is None


def pick_head(model, end2end: bool | None) -> bool | None:
    """YOLO26's head for this evaluation (``end2end``: the plan's; None keeps the model's): returns the mode to put
    back afterwards, None when nothing was changed (no choice asked, or a model without such a head)."""
    from ppmulti.rank.models.ultra_yolo import UltraYOLO

    if end2end is None or not isinstance(model, UltraYOLO):
        return None
    before = model.head.end2end
    model.head.end2end = end2end
    return before


def rank0_statistics(model) -> int:
    """Rank 0's BatchNorm running statistics on every rank (returns how many tensors): each rank scores its shard
    of the eval set, and with per-rank BatchNorm each rank's statistics (and their EMA) are its own, so the mAP would
    mix the ranks' models instead of scoring the weights rank 0 saves. The trained parameters agree already (the
    tensors taken: those without gradient, BatchNorm's _mean and _variance, and any frozen layer's, equal anyway)."""
    import paddle.distributed as pdist

    statistics = [t for t in model.state_dict().values() if t.stop_gradient]   # BatchNorm's _mean and _variance
    for tensor in statistics:
        pdist.broadcast(tensor, src=0)
    return len(statistics)
