"""results.png and PR_curve.png, drawn by rank 0 on evaluated epochs; YOLOv5's confusion matrix and F1, P, R curves
of the last evaluation at the end."""

from __future__ import annotations

import logging
from pathlib import Path

from ppmulti.rank import dist
from ppmulti.rank.engine.hooks.base import Hook

log = logging.getLogger("ppmulti")



class PlotsHook(Hook):
    """Rank 0 draws ``results.png`` from results.csv and ``PR_curve.png`` on every evaluated epoch (matplotlib
    costs a fraction of a second, so not on every epoch). The last epoch always evaluates, so the final
    plots need no drawing of their own."""

    priority = 80   # after ResultsHook: it draws from the results.csv just written

    def after_epoch(self, trainer, stats) -> None:
        if not dist.is_main() or not stats.metrics:
            return
        self._results(trainer)
        curve = getattr(stats, "pr_curve", None)
        if curve is not None:
            from ppmulti.rank.engine.plots import PR_PNG, plot_pr

            self._guard(plot_pr, curve, Path(trainer.run_dir) / PR_PNG)

    def after_train(self, trainer) -> None:
        """confusion_matrix.png, F1_curve.png, P_curve.png, R_curve.png of the run's last evaluation (every rank's
        images), drawn once, as YOLOv5 draws them after its final validation."""
        diag = getattr(trainer, "last_diagnostics", None)
        if dist.is_main() and diag is not None:
            from ppmulti.rank.engine.plots import plot_diagnostics

            self._guard(plot_diagnostics, diag, Path(trainer.run_dir))

    def _results(self, trainer) -> None:
        from ppmulti.rank.engine.plots import RESULTS_PNG, plot_results

        csv_path = Path(trainer.run_dir) / "results.csv"
        if csv_path.is_file():
            self._guard(plot_results, csv_path, Path(trainer.run_dir) / RESULTS_PNG)

    @staticmethod
    def _guard(fn, *args) -> None:
        try:
            fn(*args)
        except Exception as exc:  # a plot is a convenience: never stop a training for it
            log.warning("could not draw %s: %s: %s", args[-1], type(exc).__name__, exc)
