"""MuSGD as a run's optimizer: ultralytics' parameter groups of a model, each group's lr from the run's schedule,
and the face of a Paddle optimizer that the trainer, its step (clipping, GradScaler), hooks and checkpoints use."""

from __future__ import annotations

from typing import Any

from ppmulti.common.errors import UserError
from ppmulti.rank.engine import ultra_recipe
from ppmulti.rank.engine.musgd import MuSGD
from ppmulti.rank.engine.ultra_recipe import MUSGD_TYPE

__all__ = ["model_groups", "ScheduledMuSGD", "from_config", "refuse_amp"]


def _is_norm(layer: Any) -> bool:
    # ultralytics: any torch.nn class with "Norm" in its name (BatchNorm2d, LayerNorm, GroupNorm, ...)
    return "Norm" in type(layer).__name__


def _boosted_layers(model: Any) -> list:
    """The head's class branches (``cv3``, YOLO26's ``one2one_cv3`` too), whose parameters MuSGD trains at 3x the lr:
    those of the last ultralytics Detect head in the model (none in other models)."""
    from ppmulti.rank.models.ultra_head import UltraDetect

    heads = [layer for layer in model.sublayers(include_self=True) if isinstance(layer, UltraDetect)]
    if not heads:
        return []
    head = heads[-1]
    return [m for m in (getattr(head, "cv3", None), getattr(head, "one2one_cv3", None)) if m is not None]


def model_groups(model: Any, weight_decay: float) -> tuple[list[ultra_recipe.ParamGroupSpec], dict[str, Any]]:
    """ultralytics' MuSGD groups of ``model``'s trainable parameters (ultra_recipe.param_groups, by structured
    name: 'muon' for matrices and conv filters, 'bias', 'bn'; each split into the head's class branches at 3x the
    lr and the rest) and the parameters by name. Frozen ones (BatchNorm's running statistics, --freeze) stay out,
    as ppdet's OptimizerBuilder leaves them out."""
    named: dict[str, Any] = {}
    seen: set[int] = set()   # a parameter shared by two layers joins once, under its first name
    triples = []
    for layer_name, layer in model.named_sublayers(include_self=True):
        for pname, param in layer.named_parameters(include_sublayers=False):
            if param.stop_gradient or id(param) in seen:
                continue
            seen.add(id(param))
            full = f"{layer_name}.{pname}" if layer_name else pname
            named[full] = param
            triples.append((full, len(param.shape), _is_norm(layer)))
    boosted_ids = {id(p) for m in _boosted_layers(model) for p in m.parameters()}
    boosted = [n for n, p in named.items() if id(p) in boosted_ids]
    return ultra_recipe.param_groups(triples, float(weight_decay), use_muon=True, boosted=boosted), named


class ScheduledMuSGD(MuSGD):
    """MuSGD over ``model``'s ultralytics groups, stepping each group at the run's lr x its gain (3 for the head's
    class branches) x each parameter's own lr factor (Paddle's ``optimize_attr['learning_rate']``, which YOLOv5's
    warmup sets on the biases). ``learning_rate``: a Paddle LRScheduler (ppdet's LearningRate: warmup and decay,
    stepped by the trainer) or a float. ``grad_clip``: a ``ClipGradByGlobalNorm`` that the run's OptimStep takes
    off and applies to all parameters at once (ultralytics clips one global norm).

    What Paddle's tools read of an optimizer is here: ``get_lr``, ``_learning_rate``, ``_parameter_list`` and a
    flat ``_param_groups`` (GradScaler's unscale, the step's clipping), ``_grad_clip``, ``momentum`` (YOLOv5's
    momentum warmup); its state_dict is keyed by structured parameter names, so a resume in a fresh process
    (other automatic Paddle names) finds its buffers."""

    is_momentum_optimizer = True   # compat.optimizer_momentum reads and sets ``momentum`` (the warmup)

    def __init__(self, model: Any, learning_rate: Any, momentum: float = 0.9, weight_decay: float = 0.0,
                 nesterov: bool = True, grad_clip: Any = None):
        specs, named = model_groups(model, weight_decay)
        groups = [{"params": [named[n] for n in spec.names], "lr": 0.0, "momentum": float(momentum),
                   "nesterov": bool(nesterov), "weight_decay": spec.weight_decay,
                   "use_muon": spec.kind == ultra_recipe.GROUP_MUON, "param_group": spec.kind,
                   "lr_gain": spec.lr_gain} for spec in specs]
        super().__init__(groups, muon=ultra_recipe.MUSGD_MUON, sgd=ultra_recipe.MUSGD_SGD)
        self._learning_rate = learning_rate
        self._grad_clip = grad_clip
        self._parameter_list = [p for g in self.param_groups for p in g["params"]]
        self._param_groups = self._parameter_list   # flat: one global clipping norm, GradScaler's list path
        self._structured = {p.name: n for n, p in named.items()}
        self._momentum_value = float(momentum)
        self.set_group_lrs(self._group_lrs())

    # ---------------------------------------------------------------- the lr
    def get_lr(self) -> float:
        lr = self._learning_rate
        return float(lr()) if callable(lr) else float(lr)

    def _group_lrs(self) -> list[float]:
        lr = self.get_lr()
        return [lr * float(g["lr_gain"]) for g in self.param_groups]

    @property
    def momentum(self) -> float:
        """The groups' momentum (one for all, as YOLOv5's and ultralytics' warmups set it)."""
        return self._momentum_value

    @momentum.setter
    def momentum(self, value: float) -> None:
        self._momentum_value = float(value)
        for g in self.param_groups:
            g["momentum"] = float(value)

    def step(self) -> None:
        self.set_group_lrs(self._group_lrs())
        super().step()

    def describe(self, lr: float | None = None) -> str:
        """The plan's line: the groups as ultralytics logs them; ``lr``: the run's planned lr (default: the
        schedule's now, 0 at a warmup's start)."""
        counts: dict[str, int] = {}
        for g in self.param_groups:
            counts[g["param_group"]] = counts.get(g["param_group"], 0) + len(g["params"])
        boosted = sum(len(g["params"]) for g in self.param_groups if g["lr_gain"] != 1.0)
        wd = max((g["weight_decay"] for g in self.param_groups), default=0.0)
        lr = self.get_lr() if lr is None else lr
        return (f"optimizer: MuSGD(lr={lr:g}, momentum={self._momentum_value:g}, Nesterov; Muon x "
                f"{self.muon:g}, SGD x {self.sgd:g}) with parameter groups {counts.get('muon', 0)} muon(decay="
                f"{wd:g}), {counts.get('bn', 0)} weight(decay=0.0), {counts.get('bias', 0)} bias(decay=0.0); "
                f"{boosted} of the head's class-branch parameters at {ultra_recipe.MUSGD_HEAD_LR_GAIN:g}x the lr")

    # ---------------------------------------------------------------- checkpoints
    def state_dict(self) -> dict:
        state = super().state_dict()
        state["state"] = {self._structured.get(k, k): v for k, v in state["state"].items()}
        state["optimizer"] = MUSGD_TYPE
        return state

    def set_state_dict(self, state: dict) -> None:
        if not isinstance(state, dict) or state.get("optimizer") != MUSGD_TYPE:
            raise UserError("the checkpoint's optimizer state is not MuSGD's (it was saved by another optimizer): "
                            "resume it with the optimizer it trained with (-o OptimizerBuilder.optimizer.type=...), "
                            "or start a new run from its weights (--weights FILE.pdparams)")
        by_name = {n: p.name for p, n in ((p, self._structured[p.name]) for p in self._parameter_list)}
        unknown = [k for k in state.get("state", {}) if k not in by_name]
        if unknown:
            raise UserError(f"the checkpoint's MuSGD state names {len(unknown)} parameter(s) this model does not "
                            f"have (e.g. {unknown[0]}): it was saved by another model; resume with the model it "
                            f"trained")
        super().set_state_dict({"state": {by_name[k]: v for k, v in state.get("state", {}).items()},
                                "groups": state.get("groups", [])})
        self._momentum_value = float(self.param_groups[0]["momentum"]) if self.param_groups else 0.0


def from_config(builder_cfg: Any, learning_rate: Any, model: Any) -> ScheduledMuSGD:
    """MuSGD from an ``OptimizerBuilder`` section (``optimizer: {type: MuSGD, momentum, use_nesterov}``,
    ``regularizer: {type: L2, factor}`` as the decayed groups' weight decay, ``clip_grad_by_norm``): where the
    run builds its optimizer. Keys MuSGD has no use for are one line naming them."""
    section = dict(builder_cfg.get("optimizer") or {})
    section.pop("type", None)
    momentum = section.pop("momentum", 0.9)
    nesterov = section.pop("use_nesterov", True)
    if section:
        raise UserError(f"OptimizerBuilder.optimizer: MuSGD takes momentum and use_nesterov; remove "
                        f"{', '.join(sorted(section))}")
    reg = builder_cfg.get("regularizer") or {}
    if reg and str(reg.get("type", "L2")) != "L2":
        raise UserError(f"OptimizerBuilder.regularizer: MuSGD decays weights as L2 (ultralytics' weight_decay); "
                        f"{reg.get('type')} is not MuSGD's")
    decay = float(reg.get("factor", 0.0) or 0.0)
    clip = None
    norm = builder_cfg.get("clip_grad_by_norm")
    if norm is not None:
        import paddle

        from ppmulti.rank.engine.optim_step import check_clip_norm

        clip = paddle.nn.ClipGradByGlobalNorm(clip_norm=check_clip_norm(norm))
    return ScheduledMuSGD(model, learning_rate, float(momentum), decay, bool(nesterov), clip)


def refuse_amp(mode: str, level: str) -> None:
    """float16 AMP at level O2 casts the model and wraps its optimizer with paddle.amp.decorate, which takes Paddle
    optimizers only: one line. O1's GradScaler drives MuSGD (it unscales ``_parameter_list`` and steps it);
    bfloat16 and float32 need no scaler."""
    if mode == "float16" and str(level).upper() == "O2":
        raise UserError("MuSGD with float16 AMP at amp_level O2: Paddle's O2 wraps only its own optimizers; use "
                        "-o amp_level=O1 (the default), or another optimizer")
