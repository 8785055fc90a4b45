"""Toy parts for loop and hook tests: a one-layer model, a list of batches, SGD, a Trainer built from them."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import paddle

from ppmulti.rank.engine.hooks import HOOK_POINTS, EvaluationHook, Hook
from ppmulti.rank.engine.trainer import Trainer, RunPlan


class ToyModel(paddle.nn.Layer):
    """y = w.x + b fitted by mean squared error; takes a batch dict and returns the losses, like a detector."""

    def __init__(self, features: int = 3):
        super().__init__()
        self.linear = paddle.nn.Linear(features, 1)

    def forward(self, data: dict) -> dict:
        err = self.linear(data["x"]) - data["y"]
        loss = (err * err).mean()
        return {"loss": loss, "loss_mse": loss}


def toy_batches(steps: int = 4, batch: int = 2, features: int = 3, seed: int = 0) -> list[dict]:
    """``steps`` batches of a fixed linear target (the same every epoch: a run is reproducible)."""
    rng = np.random.default_rng(seed)
    w = rng.normal(size=(features, 1)).astype("float32")
    out = []
    for _ in range(steps):
        x = rng.normal(size=(batch, features)).astype("float32")
        out.append({"x": paddle.to_tensor(x), "y": paddle.to_tensor(x @ w + 0.5)})
    return out


def toy_trainer(*, epochs: int = 2, steps: int = 4, hooks=(), run_dir=None, lr: float = 0.05, schedule=None,
                cfg: dict | None = None, seed: int = 0, report_by_default: bool = False, **opts) -> Trainer:
    """A Trainer over ToyModel, ``steps`` batches of 2 and SGD (``schedule``: a paddle LRScheduler used
    instead of the fixed ``lr``); ``opts`` become RunPlan fields (validate, nosave, save_period, ...);
    ``report_by_default``: ``train()`` adds the reporting hooks unless some were registered, as built runs do.
    One rank, no fleet, no ppdet: ``train()`` takes a fraction of a second."""
    paddle.seed(seed)
    model = ToyModel()
    sgd = paddle.optimizer.SGD(learning_rate=schedule if schedule is not None else lr,
                               parameters=model.parameters())
    return Trainer(model, toy_batches(steps), sgd, lr=schedule, epochs=epochs, hooks=hooks, run_dir=run_dir,
                   cfg={"log_iter": 2, **(cfg or {})}, opts=RunPlan(config="toy.yml", **opts), world=1, rank=0,
                   report_by_default=report_by_default)


class Recorder(Hook):
    """Notes every hook point it is called at, as (point, epoch, step) with None where a point has none;
    with ``sink`` and ``tag`` it also appends its tag to that shared list (the order of several hooks)."""

    def __init__(self, priority: int = 95, sink: list | None = None, tag: str = ""):
        self.priority = priority
        self.calls: list[tuple] = []
        self.sink, self.tag = sink, tag

    def __getattribute__(self, name):
        if name in HOOK_POINTS:
            calls, sink, tag = (object.__getattribute__(self, a) for a in ("calls", "sink", "tag"))

            def note(trainer, *args):
                if name == "after_epoch":
                    calls.append((name, args[0].epoch, None))
                else:
                    calls.append((name, args[0] if args else None, args[1] if len(args) > 1 else None))
                if sink is not None:
                    sink.append(tag)
            return note
        return object.__getattribute__(self, name)


class ScriptedEvaluation(EvaluationHook):
    """EvaluationHook's schedule (``--eval``, snapshot and last epochs) with mAPs from a list instead of COCO:
    the n-th evaluation scores ``maps[n]`` (mAP50 = mAP50-95 = that value)."""

    def __init__(self, maps: list[float]):
        super().__init__()
        self.maps = list(maps)
        self.evaluated_epochs: list[int] = []

    def evaluate(self, trainer):
        self.evaluator = SimpleNamespace(last_pr=None, close=lambda: None)
        score = self.maps[len(self.evaluated_epochs)]
        self.evaluated_epochs.append(trainer.state.epoch)
        return SimpleNamespace(as_dict=lambda: {"mAP50": score, "mAP50_95": score})


def sgd_losses(model, loss_of, inputs, lr: float) -> list[float]:
    """One SGD step per input on ``loss_of(model, x)``: the losses, for comparing kernels step by step."""
    opt = paddle.optimizer.SGD(learning_rate=lr, parameters=model.parameters())
    out = []
    for x in inputs:
        loss = loss_of(model, x)
        loss.backward()
        opt.step()
        opt.clear_grad()
        out.append(float(loss))
    return out
