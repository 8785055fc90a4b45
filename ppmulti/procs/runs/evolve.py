"""Hyperparameter evolution's YOLOv5 semantics: fitness, bounds, parent selection, mutation, and evolve.csv,
hyp_evolve.yaml and evolve.png (the population itself lives in an Optuna study: ``evolve_study.py``).

evolve.csv is written whole (atomically) from the study's finished trials, so a reader never sees half a row;
a torn or hand-edited line in an old file is skipped with a warning, never fatal.
"""

from __future__ import annotations

import logging
import math
import os
from pathlib import Path

import numpy as np
import yaml

from ppmulti.common.metrics import FITNESS_WEIGHTS, fitness  # noqa: F401  (one definition, shared with --patience)
from ppmulti.common.errors import UserError
from ppmulti.common.atomic import atomic_save, atomic_write_text

log = logging.getLogger("ppmulti")

METRIC_COLUMNS: tuple[str, ...] = ("fitness", "mAP50", "mAP50_95")

# key: (mutation gain, lower limit, upper limit); gain 0 means the key is never mutated.
HYP_BOUNDS: dict[str, tuple[float, float, float]] = {
    "lr0": (1, 1e-5, 1e-1), "lrf": (1, 0.01, 1.0), "momentum": (0.3, 0.6, 0.98),
    "weight_decay": (1, 0.0, 0.001), "warmup_epochs": (1, 0.0, 5.0), "warmup_momentum": (1, 0.0, 0.95),
    "warmup_bias_lr": (1, 0.0, 0.2), "box": (1, 0.02, 0.2), "cls": (1, 0.2, 4.0), "cls_pw": (1, 0.5, 2.0),
    "obj": (1, 0.2, 4.0), "obj_pw": (1, 0.5, 2.0), "iou_t": (0, 0.1, 0.7), "anchor_t": (1, 2.0, 8.0),
    "fl_gamma": (0, 0.0, 2.0), "hsv_h": (1, 0.0, 0.1), "hsv_s": (1, 0.0, 0.9), "hsv_v": (1, 0.0, 0.9),
    "degrees": (1, 0.0, 45.0), "translate": (1, 0.0, 0.9), "scale": (1, 0.0, 0.9), "shear": (1, 0.0, 10.0),
    "perspective": (0, 0.0, 0.001), "flipud": (1, 0.0, 1.0), "fliplr": (0, 0.0, 1.0), "mosaic": (1, 0.0, 1.0),
    "mixup": (1, 0.0, 1.0), "copy_paste": (1, 0.0, 1.0),
}


def _row_fitness(row: dict) -> float:
    return float(row["fitness"]) if "fitness" in row else fitness(row)


def _hyp_of(row: dict) -> dict[str, float]:
    return {k: v for k, v in row.items() if k not in METRIC_COLUMNS}


def make_row(metrics: dict, hyp: dict) -> dict[str, float]:
    """One evolve.csv row: fitness, mAP50, mAP50_95, then the hyps (numbers only)."""
    try:
        m50, m5095 = float(metrics["mAP50"]), float(metrics["mAP50_95"])
    except KeyError as exc:
        raise ValueError(f"metrics need 'mAP50' and 'mAP50_95', got {sorted(metrics)}") from exc
    for k, v in hyp.items():
        if "," in k or not k.strip() or k in METRIC_COLUMNS:
            raise UserError(f"hyperparameter name {k!r} cannot be an evolve.csv column; rename it")
        try:
            float(v)
        except (TypeError, ValueError):
            raise UserError(f"hyperparameter {k}={v!r} is not a number; only numeric hyps can be evolved") from None
    return {"fitness": fitness({"mAP50": m50, "mAP50_95": m5095}), "mAP50": m50, "mAP50_95": m5095,
            **{k: float(v) for k, v in hyp.items()}}


class EvolveStore:
    """One evolve.csv: header ``fitness,mAP50,mAP50_95,<hyp keys>``, one line per finished candidate; written
    whole from the study (``write``), read by ``rows`` (also by ``ppmulti ps``)."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        self._warned: set[tuple[int, str]] = set()

    def _parse_header(self, line: str) -> list[str]:
        cols = [c.strip() for c in line.strip().split(",")]
        if tuple(cols[:3]) != METRIC_COLUMNS or len(set(cols)) != len(cols):
            raise UserError(f"{self.path}: line 1 is not an evolve.csv header (expected "
                            f"'fitness,mAP50,mAP50_95,<unique hyp keys>'); move the file away or pick another path")
        return cols

    def write(self, rows: list[dict[str, float]]) -> None:
        """Replace the file with ``rows`` (each as ``make_row`` returns it; the first fixes the columns)."""
        if not rows:
            return
        header = list(rows[0])
        lines = [",".join(header)] + [",".join(repr(float(r[k])) for k in header) for r in rows]
        atomic_write_text(self.path, "\n".join(lines) + "\n")

    def rows(self) -> list[dict[str, float]]:
        """Every well-formed row as {column: float}; malformed lines are skipped (warned about once)."""
        try:
            lines = self.path.read_text(encoding="utf-8").splitlines()
        except FileNotFoundError:
            return []
        if not lines or not lines[0].strip():
            return []
        header = self._parse_header(lines[0])
        out = []
        for lineno, line in enumerate(lines[1:], start=2):
            if not line.strip():
                continue
            fields = line.split(",")
            problem = None
            if len(fields) != len(header):
                problem = f"{len(fields)} fields, expected {len(header)}"
            else:
                try:
                    vals = [float(x) for x in fields]
                    if not all(math.isfinite(x) for x in vals):
                        problem = "non-finite value"
                except ValueError:
                    problem = "non-numeric value"
            if problem is None:
                out.append(dict(zip(header, vals)))
            elif (lineno, line) not in self._warned:
                self._warned.add((lineno, line))
                log.warning("%s: skipping malformed line %d (%s)", self.path, lineno, problem)
        return out


def select_parent(rows: list[dict], rng: np.random.RandomState, n: int = 5, method: str = "single") -> dict:
    """Hyps of a parent drawn from the top-``n`` rows by fitness ('single') or their weighted mean ('weighted')."""
    if not rows:
        raise ValueError("select_parent needs at least one row")
    if method not in ("single", "weighted"):
        raise ValueError(f"method must be 'single' or 'weighted', not {method!r}")
    top = sorted(rows, key=_row_fitness, reverse=True)[:max(1, n)]
    fit = np.array([_row_fitness(r) for r in top])
    w = fit - fit.min() + 1e-6
    if method == "single" or len(top) == 1:
        return dict(_hyp_of(top[rng.choice(len(top), p=w / w.sum())]))
    keys = list(_hyp_of(top[0]))
    return {k: float(sum(wi * r[k] for wi, r in zip(w, top)) / w.sum()) for k in keys}


def mutate(parent: dict, rng: np.random.RandomState, bounds: dict[str, tuple[float, float, float]] = HYP_BOUNDS,
           mp: float = 0.8, s: float = 0.2) -> dict:
    """YOLOv5 mutation: multiply each bounded key by a random factor in [0.3, 3], clip, round to 5 digits."""
    child = dict(parent)
    keys = [k for k in parent if k in bounds and bounds[k][0] != 0]
    if not keys:
        return child
    g = np.array([bounds[k][0] for k in keys], dtype=float)
    n = len(keys)
    # a factor near 1 can round (5 digits) or clip back to the parent's value: draw again, a bounded
    # number of times (a parent whose every key sits at 0 or at a bound cannot change at all)
    for _ in range(100):
        v = np.ones(n)
        while np.all(v == 1):
            v = (g * (rng.random(n) < mp) * rng.randn(n) * rng.random() * s + 1).clip(0.3, 3.0)
        for k, factor in zip(keys, v):
            _, lo, hi = bounds[k]
            x = min(max(float(parent[k]) * float(factor), lo), hi)
            child[k] = float(f"{x:.5g}")
        if any(child[k] != parent[k] for k in keys):
            break
    return child


def breed(rows: list[dict], base_hyp: dict, rng: np.random.RandomState,
          bounds: dict[str, tuple[float, float, float]] = HYP_BOUNDS) -> tuple[dict, dict]:
    """(parent, child): the parent drawn from the best ``rows`` (base_hyp when there are none), mutated."""
    parent = dict(base_hyp) if not rows else {**base_hyp, **select_parent(rows, rng)}
    return parent, mutate(parent, rng, bounds)


def best(store: EvolveStore, rows: list[dict] | None = None) -> tuple[dict, dict] | None:
    """(metrics, hyp) of the fittest row, or None when there is none; ``rows``: the store's rows, already read."""
    rows = store.rows() if rows is None else rows
    if not rows:
        return None
    top = max(rows, key=_row_fitness)
    return {k: top[k] for k in METRIC_COLUMNS}, _hyp_of(top)


def _best_or_error(store: EvolveStore, rows: list[dict] | None = None) -> tuple[dict, dict]:
    found = best(store, rows)
    if found is None:
        raise UserError(f"{store.path} has no finished runs yet; run at least one evolve generation first")
    return found


def write_best_yaml(store: EvolveStore, path: str | os.PathLike, rows: list[dict] | None = None) -> None:
    """Write the best row's hyps as YAML (atomically) under YOLOv5's comment header: best and last generation
    (0-based rows of evolve.csv) and the best row's metrics (``rows``: as for best)."""
    rows = store.rows() if rows is None else rows
    metrics, hyp = _best_or_error(store, rows)
    i = max(range(len(rows)), key=lambda j: _row_fitness(rows[j]))
    head = ("# Hyperparameter Evolution Results\n"
            f"# Best generation: {i}\n# Last generation: {len(rows) - 1}\n"
            "# " + ", ".join(f"{k:>20s}" for k in metrics) + "\n"
            "# " + ", ".join(f"{v:>20.5g}" for v in metrics.values()) + "\n\n")
    atomic_write_text(path, head + yaml.safe_dump(hyp, sort_keys=False))


def plot(store: EvolveStore, png_path: str | os.PathLike, rows: list[dict] | None = None) -> None:
    """One subplot per hyperparameter: fitness against its value, the best run marked with a red '+'
    (``rows``: as for best)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    rows = store.rows() if rows is None else rows
    _, best_hyp = _best_or_error(store, rows)
    keys = list(best_hyp)
    fit = np.array([_row_fitness(r) for r in rows])
    cols = max(1, math.ceil(math.sqrt(len(keys))))
    nrows = max(1, math.ceil(len(keys) / cols))
    fig = Figure(figsize=(cols * 2.6, nrows * 2.3), dpi=100)
    fig.subplots_adjust(left=0.05, right=0.98, bottom=0.04, top=0.96, wspace=0.35, hspace=0.5)
    FigureCanvasAgg(fig)
    best_fit = float(fit.max())
    for i, k in enumerate(keys):
        ax = fig.add_subplot(nrows, cols, i + 1)
        ax.scatter([r[k] for r in rows], fit, c=fit, cmap="viridis", s=8, alpha=0.8, edgecolors="none")
        ax.plot(best_hyp[k], best_fit, "r+", markersize=14, markeredgewidth=2)
        ax.set_title(f"{k} = {best_hyp[k]:.3g}", fontsize=8)
        ax.tick_params(labelsize=6)
        if i % cols == 0:
            ax.set_ylabel("fitness", fontsize=7)
    atomic_save(png_path, lambda tmp: fig.savefig(tmp, format="png"))
