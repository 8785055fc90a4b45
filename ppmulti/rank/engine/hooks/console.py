"""Console and train.log lines (and a rank-0 terminal's progress bars): losses, lr, throughput."""

from __future__ import annotations

import logging
import time

from ppmulti.rank.engine.hooks.base import Hook, host_losses

log = logging.getLogger("ppmulti")



class ConsoleLogHook(Hook):
    """Every ``log_iter`` steps: losses, lr, throughput (this rank's log; rank 0's is the console).

    On a terminal (rank 0) an epoch bar shows the same figures in its postfix; the per-interval lines then
    go to train.log only, so the console is not filled twice. Off a terminal nothing changes."""

    priority = 50   # after evaluation and early stop: the epoch line carries the mAP, after the stop warning

    def __init__(self, stream=None):
        self.stream = stream   # the console; None: sys.stdout (tests pass their own)
        self.bar = None
        self.bars = None

    def before_train(self, trainer) -> None:
        from ppmulti.rank.engine.progress import ConsoleBars, wants_bars

        self.interval = max(1, int(trainer.cfg.get("log_iter", 20)))
        self.tic = time.time()
        self.steps = 0
        self.data_mark = 0.0   # the epoch's data wait so far at the last line (the loop gives a running total)
        self.bar = None
        self.bars = ConsoleBars(self.stream).__enter__() if wants_bars(self.stream) else None

    def after_step(self, trainer, epoch, step, outputs, lr, data_time) -> None:
        self.steps += 1
        if self.bars is not None:
            if self.bar is None:   # opened on the first step, so a resumed epoch starts part-way
                self.bar = self.bars.bar(trainer.steps_per_epoch, f"epoch {epoch + 1}/{trainer.cfg['epoch']}",
                                         initial=step)
            self.bar.update(1)
        if (step + 1) % self.interval and step + 1 != trainer.steps_per_epoch:
            return
        elapsed = time.time() - self.tic
        ips = self.steps * trainer.batch.global_batch / elapsed if elapsed > 0 else 0.0
        values = host_losses(outputs)
        losses = " ".join(f"{k}={v:.4f}" for k, v in values.items())
        extra = None
        if self.bar is not None:
            # throughput first: a narrow terminal cuts the postfix from the right
            short = " ".join(f"{k if k == 'loss' else k[5:]}={v:.3f}" for k, v in values.items())
            self.bar.set_postfix_str(f"{ips:.1f} img/s lr={lr:.3g} {short}", refresh=False)
            from ppmulti.rank.engine.progress import FILE_ONLY

            extra = {FILE_ONLY: True}
        if data_time < self.data_mark:   # a new epoch's total
            self.data_mark = 0.0
        wait = max(0.0, data_time - self.data_mark) / self.steps   # mean data wait per step since the last line
        log.info("epoch %d/%d step %d/%d %s lr=%.6g %.1f img/s (global) data %.3fs/step",
                 epoch + 1, trainer.cfg["epoch"], step + 1, trainer.steps_per_epoch, losses, lr, ips,
                 wait, extra=extra)
        self.tic = time.time()
        self.steps = 0
        self.data_mark = data_time

    def _close_bar(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    def after_epoch(self, trainer, stats) -> None:
        self._close_bar()
        msg = (f"epoch {stats.epoch + 1} done in {stats.seconds:.1f}s, {stats.images_per_s:.2f} img/s, "
               + " ".join(f"{k}={v:.4f}" for k, v in stats.losses.items()))
        if stats.metrics:
            msg += "; " + metrics_label(stats.metrics)
        if getattr(stats, "amp", None):
            msg += f"; AMP skipped {stats.amp['skipped_steps']} steps, loss scale {stats.amp['loss_scale']:g}"
        log.info(msg)
        self.tic = time.time()
        self.steps = 0

    def after_train(self, trainer) -> None:
        self.close(trainer)

    def close(self, trainer) -> None:
        # also on an exception or Ctrl-C: stdout, stderr and the console handler must not stay wrapped
        self._close_bar()
        if self.bars is not None:
            self.bars.__exit__(None, None, None)
            self.bars = None


def metrics_label(metrics: dict) -> str:
    """The epoch line's mAPs, each named by what computed it (evaluator.EvalResult's ``metric``)."""
    m50, m50_95 = metrics["mAP50"], metrics["mAP50_95"]
    if metrics.get("metric") == "VOC":
        return f"VOC bbox mAP50={m50:.4f} (ppdet's DetectionMAP) mAP50-95={m50_95:.4f} (YOLOv5's)"
    return f"COCO bbox mAP50={m50:.4f} mAP50-95={m50_95:.4f} (pycocotools)"
