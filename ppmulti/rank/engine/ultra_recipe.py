"""Ultralytics 8.4's training recipe as pure functions: its hyperparameters, optimizer=auto, parameter groups,
nominal-batch accumulation, weight-decay scaling, per-epoch lr lambda, batch warmup and close_mosaic."""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field
from typing import Iterable, Iterator, Sized

__all__ = ["HYP", "NBS", "OptimizerChoice", "auto_optimizer", "choose_optimizer", "nominal_accumulate",
           "scaled_weight_decay", "auto_iterations", "lr_lambda", "warmup_batches", "WarmupState", "warmup_state",
           "mosaic_closed", "GROUP_DECAY", "GROUP_NORM", "GROUP_BIAS", "GROUP_MUON", "classify_parameter",
           "ParamGroupSpec", "param_groups", "MUSGD_MUON", "MUSGD_SGD", "MUSGD_HEAD_LR_GAIN", "Recipe", "plan",
           "decays", "ppdet_optimizer", "lr_reference", "AUTO_TYPE", "MUSGD_TYPE", "wants_musgd", "choose_for_run",
           "auto_note", "adamw_decay_groups"]

# cfg/default.yaml's training hyperparameters in 8.4 (the keys a detection run reads).
HYP: dict[str, float | int | bool | str] = {
    "epochs": 100, "batch": 16, "imgsz": 640, "optimizer": "auto", "cos_lr": False, "close_mosaic": 10,
    "lr0": 0.01, "lrf": 0.01, "momentum": 0.937, "weight_decay": 0.0005, "warmup_epochs": 3.0,
    "warmup_momentum": 0.8, "warmup_bias_lr": 0.1, "box": 7.5, "cls": 0.5, "dfl": 1.5, "nbs": 64,
    "hsv_h": 0.015, "hsv_s": 0.7, "hsv_v": 0.4, "degrees": 0.0, "translate": 0.1, "scale": 0.5, "shear": 0.0,
    "perspective": 0.0, "flipud": 0.0, "fliplr": 0.5, "mosaic": 1.0, "mixup": 0.0, "cutmix": 0.0,
    "conf": 0.001, "iou": 0.7, "max_det": 300,
}
NBS = 64                 # the nominal batch: gradients accumulate up to about this many images per step
GRAD_CLIP_NORM = 10.0    # every optimizer step clips the global gradient norm to this
EMA_DECAY, EMA_TAU = 0.9999, 2000   # ModelEMA: decay x (1 - exp(-updates / tau))
AUTO_ITERATIONS = 10000  # optimizer=auto: more steps than this -> MuSGD, else AdamW

OPTIMIZERS = ("SGD", "MuSGD", "Adam", "Adamax", "AdamW", "NAdam", "RAdam", "RMSProp", "auto")


@dataclass(frozen=True)
class OptimizerChoice:
    """The optimizer a run uses and why: ``name`` (ultralytics' spelling), its lr and momentum (SGD momentum or
    Adam's beta1), and the warmup's starting bias lr (auto sets it to 0)."""

    name: str
    lr: float
    momentum: float
    warmup_bias_lr: float
    reason: str = ""


def auto_iterations(dataset_size: int, batch: int, epochs: int, nbs: int = NBS) -> int:
    """The optimizer steps ``optimizer=auto`` reckons with: ceil(images / max(batch, nbs)) x epochs."""
    return math.ceil(int(dataset_size) / max(int(batch), int(nbs))) * int(epochs)


def auto_optimizer(nc: int, iterations: int) -> OptimizerChoice:
    """8.4's ``optimizer=auto``: MuSGD (lr 0.01, momentum 0.9) for more than 10,000 steps, else AdamW with lr
    fitted to the number of classes (round(0.002 x 5 / (4 + nc), 6)), momentum 0.9; lr0 is ignored and the bias
    warmup starts at 0. The same rule for YOLOv8, YOLO11 and YOLO26."""
    if iterations > AUTO_ITERATIONS:
        return OptimizerChoice("MuSGD", 0.01, 0.9, 0.0, f"optimizer=auto: {iterations} iterations > 10000")
    lr_fit = round(0.002 * 5 / (4 + int(nc)), 6)
    return OptimizerChoice("AdamW", lr_fit, 0.9, 0.0,
                           f"optimizer=auto: {iterations} iterations <= 10000, lr fitted to nc={nc}")


def choose_optimizer(name: str, nc: int, iterations: int, lr0: float = HYP["lr0"],
                     momentum: float = HYP["momentum"], warmup_bias_lr: float = HYP["warmup_bias_lr"]
                     ) -> OptimizerChoice:
    """``optimizer=NAME`` (any case, as ultralytics matches it) or ``auto``; an unknown name raises ValueError
    naming the choices."""
    known = {x.lower(): x for x in OPTIMIZERS}
    canonical = known.get(str(name).lower())
    if canonical is None:
        raise ValueError(f"optimizer={name}: not an optimizer ultralytics knows; use one of {', '.join(OPTIMIZERS)}")
    if canonical == "auto":
        return auto_optimizer(nc, iterations)
    return OptimizerChoice(canonical, float(lr0), float(momentum), float(warmup_bias_lr), f"optimizer={canonical}")


def nominal_accumulate(batch: int, nbs: int = NBS, batches_per_epoch: int | None = None,
                       epochs: int | None = None) -> int:
    """Batches per optimizer step: max(round(nbs / global batch), 1), never more than the run's batches."""
    acc = max(round(int(nbs) / int(batch)), 1)
    if batches_per_epoch is not None and epochs is not None:
        acc = min(acc, int(batches_per_epoch) * int(epochs))
    return max(acc, 1)


def scaled_weight_decay(weight_decay: float, batch: int, accumulate: int, nbs: int = NBS) -> float:
    """The decay the 'weight' (and MuSGD's 'muon') group gets: weight_decay x batch x accumulate / nbs, with the
    accumulation before the run-length cap (as ultralytics computes it)."""
    return float(weight_decay) * int(batch) * int(accumulate) / int(nbs)


def lr_lambda(epoch: float, epochs: int, lrf: float, cos_lr: bool = False) -> float:
    """The lr factor of ``epoch`` (stepped once per epoch, at its start): linear from 1 to lrf over ``epochs``
    (max(1 - e / epochs, 0) x (1 - lrf) + lrf), or with cos_lr the half cosine from 1 to lrf."""
    if cos_lr:
        return max((1 - math.cos(epoch * math.pi / epochs)) / 2, 0) * (lrf - 1) + 1
    return max(1 - epoch / epochs, 0) * (1.0 - lrf) + lrf


def warmup_batches(warmup_epochs: float, batches_per_epoch: int, epochs: int) -> int:
    """The warmup's length in batches: round(warmup_epochs x batches per epoch), the warmup epochs capped at
    epochs - 1 so the last epoch trains at the scheduled lr (no 100-batch floor, unlike YOLOv5)."""
    w = min(float(warmup_epochs), max(int(epochs) - 1, 0))
    return round(w * int(batches_per_epoch)) if w > 0 else 0


@dataclass(frozen=True)
class WarmupState:
    """One batch's warmup values: batches per step, the lr of the bias group and of the others, momentum."""

    accumulate: int
    bias_lr: float
    lr: float
    momentum: float | None


def warmup_state(ni: int, nw: int, accumulate: int, lr_target: float, warmup_bias_lr: float,
                 momentum: float | None, warmup_momentum: float = HYP["warmup_momentum"]) -> WarmupState | None:
    """The values at the run's batch ``ni`` while ``ni <= nw`` (None after the warmup): accumulation from 1 to
    ``accumulate`` (numpy's round, half to even), the biases' lr from ``warmup_bias_lr`` and the others' from 0
    to ``lr_target`` (lr0 x this epoch's factor), momentum from ``warmup_momentum`` (SGD-type optimizers only)."""
    if not nw or ni > nw:
        return None
    frac = ni / nw
    acc = max(1, int(round(1 + (accumulate - 1) * frac)))
    mom = None if momentum is None else warmup_momentum + (momentum - warmup_momentum) * frac
    return WarmupState(acc, warmup_bias_lr + (lr_target - warmup_bias_lr) * frac, lr_target * frac, mom)


def mosaic_closed(epoch: int, epochs: int, close_mosaic: int) -> bool:
    """Whether mosaic (and mixup, cutmix, copy-paste) is off in ``epoch`` (0-based): the last ``close_mosaic``."""
    return bool(close_mosaic) and epoch >= int(epochs) - int(close_mosaic)


# ----------------------------------------------------------------------------- parameter groups
GROUP_DECAY, GROUP_NORM, GROUP_BIAS, GROUP_MUON = "weight", "bn", "bias", "muon"
MUSGD_MUON, MUSGD_SGD = 0.2, 1.0     # MuSGD's factors on the lr of its Muon and SGD parts in 'muon' groups
MUSGD_HEAD_LR_GAIN = 3.0             # MuSGD: the class branches of the head (cv3, one2one_cv3) train at 3 x lr


def classify_parameter(full_name: str, ndim: int, in_norm_layer: bool, use_muon: bool) -> str:
    """Which of ultralytics' groups a parameter joins: with MuSGD every matrix or conv filter (2-D, 4-D) is
    'muon'; otherwise a name with 'bias' is 'bias' (no decay), a normalisation layer's weight (or a
    'logit_scale') is 'bn' (no decay), anything else 'weight' (decayed)."""
    if use_muon and ndim in (2, 4):
        return GROUP_MUON
    if "bias" in full_name:
        return GROUP_BIAS
    if in_norm_layer or "logit_scale" in full_name:
        return GROUP_NORM
    return GROUP_DECAY


@dataclass
class ParamGroupSpec:
    """One optimizer group: its kind, the parameters' names, its weight decay and its lr gain."""

    kind: str
    names: list[str] = field(default_factory=list)
    weight_decay: float = 0.0
    lr_gain: float = 1.0


def param_groups(params: Iterable[tuple[str, int, bool]], decay: float, use_muon: bool = False,
                 boosted: Iterable[str] = ()) -> list[ParamGroupSpec]:
    """ultralytics' groups from (full name, ndim, in a normalisation layer) triples: 'bias' and 'bn' without
    decay, 'weight' (and 'muon') with ``decay``; with MuSGD each group splits into its ``boosted`` names (lr
    x 3) and the rest. Empty groups are kept out."""
    order = [GROUP_BIAS, GROUP_DECAY, GROUP_NORM] + ([GROUP_MUON] if use_muon else [])
    by_kind: dict[str, list[str]] = {k: [] for k in order}
    for name, ndim, in_norm in params:
        by_kind[classify_parameter(name, ndim, in_norm, use_muon)].append(name)
    boosted = set(boosted)
    groups = []
    for kind in order:
        wd = decay if kind in (GROUP_DECAY, GROUP_MUON) else 0.0
        names = by_kind[kind]
        if use_muon:
            fast = [n for n in names if n in boosted]
            slow = [n for n in names if n not in boosted]
            groups += [ParamGroupSpec(kind, fast, wd, MUSGD_HEAD_LR_GAIN), ParamGroupSpec(kind, slow, wd, 1.0)]
        else:
            groups.append(ParamGroupSpec(kind, names, wd, 1.0))
    return [g for g in groups if g.names]


# ----------------------------------------------------------------------------- a run's plan
@dataclass(frozen=True)
class Recipe:
    """Everything ultralytics decides before a detection run's first batch (``plan``)."""

    optimizer: OptimizerChoice
    batch: int                 # global batch
    accumulate: int
    weight_decay: float        # for the decayed groups (scaled)
    iterations: int            # what optimizer=auto reckoned with
    warmup_batches: int
    epochs: int
    lrf: float
    cos_lr: bool
    close_mosaic: int
    nbs: int

    def lr_at(self, epoch: int) -> float:
        """The scheduled lr of ``epoch`` after the warmup (lr0 x the epoch's factor)."""
        return self.optimizer.lr * lr_lambda(epoch, self.epochs, self.lrf, self.cos_lr)

    def describe(self) -> str:
        opt = self.optimizer
        return (f"ultralytics recipe: {opt.name}(lr={opt.lr:g}, momentum={opt.momentum:g}) [{opt.reason}]; "
                f"global batch {self.batch} x accumulate {self.accumulate} (nbs {self.nbs}); weight decay "
                f"{self.weight_decay:g}; warmup {self.warmup_batches} batches; "
                f"{'cosine' if self.cos_lr else 'linear'} lr to lrf {self.lrf:g} over {self.epochs} epochs; "
                f"mosaic off for the last {self.close_mosaic} epochs")


def plan(dataset_size: int, batch: int, epochs: int, nc: int, batches_per_epoch: int | None = None,
         hyp: dict | None = None) -> Recipe:
    """The recipe of a run: ``batch`` is the global batch, ``hyp`` overrides HYP's keys (lr0, optimizer, ...)."""
    h = dict(HYP)
    h.update(hyp or {})
    nbs = int(h["nbs"])
    if batches_per_epoch is None:
        batches_per_epoch = max(1, int(dataset_size) // int(batch))
    acc_nominal = max(round(nbs / int(batch)), 1)
    wd = scaled_weight_decay(float(h["weight_decay"]), batch, acc_nominal, nbs)
    acc = nominal_accumulate(batch, nbs, batches_per_epoch, epochs)
    iterations = auto_iterations(dataset_size, batch, epochs, nbs)
    opt = choose_optimizer(str(h["optimizer"]), nc, iterations, float(h["lr0"]), float(h["momentum"]),
                           float(h["warmup_bias_lr"]))
    return Recipe(opt, int(batch), acc, wd, iterations,
                  warmup_batches(float(h["warmup_epochs"]), batches_per_epoch, epochs), int(epochs),
                  float(h["lrf"]), bool(h["cos_lr"]), int(h["close_mosaic"]), nbs)


# ----------------------------------------------------------------------------- onto a ppdet config
_NORM_PREFIXES = ("batch_norm", "sync_batch_norm", "layer_norm", "group_norm", "instance_norm")


def decays(param_name: str) -> bool:
    """Whether ultralytics decays a Paddle parameter, from its automatic name (``conv2d_3.w_0``,
    ``batch_norm2d_1.b_0``): weights of convolutions and linear layers yes; biases and normalisation layers'
    weights no. For AdamW's ``apply_decay_param_fun`` (ppdet passes the optimizer's other keys through)."""
    layer, _, suffix = param_name.rpartition(".")
    return suffix.startswith("w_") and not layer.startswith(_NORM_PREFIXES)


# OptimizerBuilder.optimizer.type of a MuSGD run (config.yml keeps it, so a bare --resume builds MuSGD again):
# the engine builds it (engine.musgd_run) before ppdet's OptimizerBuilder, which knows paddle.optimizer's only
MUSGD_TYPE = "MuSGD"


def wants_musgd(builder_cfg) -> bool:
    """Whether an ``OptimizerBuilder`` section asks for MuSGD."""
    section = (builder_cfg or {}).get("optimizer") or {}
    return str(section.get("type")) == MUSGD_TYPE


def ppdet_optimizer(choice: OptimizerChoice, weight_decay: float) -> dict:
    """The ``OptimizerBuilder`` section (gradient norm clipped at 10) that trains as ``choice`` does
    (ppmulti's ultralytics models keep biases and BatchNorm out of the L2 regulariser themselves): SGD ->
    Momentum with Nesterov and L2 ``weight_decay``; AdamW -> AdamW (beta1 = momentum, beta2 0.999) with
    decoupled decay on the decayed parameters only; Adam -> Adam with L2 ``weight_decay`` (torch's Adam adds
    the 'weight' group's decay to the gradient); MuSGD -> type MuSGD with Nesterov momentum and ``weight_decay``
    on its 'muon' groups, which the engine builds itself (engine.musgd_run), not ppdet."""
    # every ultralytics step clips the gradient's global norm at 10; ppmulti's loss x ref_batch (64) over
    # averaged batches gives the gradient ultralytics clips (loss x batch, summed over ~64 images' batches)
    clip = {"clip_grad_by_norm": GRAD_CLIP_NORM}
    if choice.name == "SGD":
        return {"optimizer": {"type": "Momentum", "momentum": choice.momentum, "use_nesterov": True},
                "regularizer": {"type": "L2", "factor": weight_decay}, **clip}
    if choice.name == "AdamW":
        return {"optimizer": {"type": "AdamW", "beta1": choice.momentum, "beta2": 0.999,
                              "weight_decay": weight_decay, "apply_decay_param_fun": decays},
                "regularizer": None, **clip}
    if choice.name == "Adam":
        return {"optimizer": {"type": "Adam", "beta1": choice.momentum, "beta2": 0.999},
                "regularizer": {"type": "L2", "factor": weight_decay}, **clip}
    if choice.name == "MuSGD":
        return {"optimizer": {"type": MUSGD_TYPE, "momentum": choice.momentum, "use_nesterov": True},
                "regularizer": {"type": "L2", "factor": weight_decay}, **clip}
    raise ValueError(f"optimizer={choice.name}: ppmulti trains with SGD, MuSGD, Adam and AdamW; "
                     f"{choice.name} is not wired into a run")


def lr_reference(choice: OptimizerChoice, effective_batch: int, nbs: int = NBS) -> int:
    """The batch ppmulti should scale the lr from (its ``ref_batch``) to take ultralytics' step: SGD's update
    grows with the loss, which ultralytics scales by the images per step, so lr0 is for ``nbs`` images (with
    the loss x nbs, ppmulti's 'ref_batch' scaling); Adam's does not, so lr0 holds at any batch (ref_batch =
    the effective batch: no scaling)."""
    return int(nbs) if choice.name in ("SGD", "MuSGD") else int(effective_batch)


# ----------------------------------------------------------------------------- optimizer=auto in a run
AUTO_TYPE = "auto"   # OptimizerBuilder.optimizer.type in configs/ultralytics: decided per run by choose_for_run


def auto_note(choice: OptimizerChoice, iterations: int, nc: int, ignored_lr: float | None = None,
              built: str | None = None) -> str:
    """The line a run logs when ``optimizer=auto`` decides: what was counted and what was chosen (ultralytics
    prints the same facts at the start of its training)."""
    if choice.name == "MuSGD":
        why = f"{iterations} optimizer step(s) planned (more than {AUTO_ITERATIONS}): MuSGD"
    else:
        why = (f"{iterations} optimizer step(s) planned (at most {AUTO_ITERATIONS}): AdamW, its lr "
               f"fitted to {nc} classes")
    made = built or choice.name
    ignored = (f"; lr0={ignored_lr:g} and momentum are not used (give optimizer=SGD, MuSGD, Adam or AdamW to set them)"
               if ignored_lr is not None and ignored_lr != choice.lr else "")
    return (f"optimizer: optimizer=auto chooses the optimizer, lr0 and momentum for this run: {why} -> "
            f"{made}(lr={choice.lr:g}, momentum={choice.momentum:g}), biases' warmup lr from "
            f"{choice.warmup_bias_lr:g}{ignored}")


def choose_for_run(cfg, images: Sized, batch, nbs: int | None = None) -> list[str]:
    """The engine's hook before the lr is planned: a config whose ``OptimizerBuilder.optimizer.type`` is
    ``auto`` (configs/ultralytics' default, ultralytics' ``optimizer=auto``) gets the optimizer ultralytics would
    pick for this run (``auto_optimizer`` from the training ``images`` (the dataset's records), the global
    batch, epochs and classes):
    its ppdet section, ``base_lr``, ``warmup_bias_lr`` and, for Adam-type optimizers, a ``ref_batch`` equal to
    the effective batch (their lr does not scale with the batch: ``lr_reference``). ``batch`` is the engine's
    BatchPlan. Returns the notes to log; [] (nothing changed) for any other optimizer type.

    MuSGD (past 10,000 steps) is written as ``type: MuSGD``, which the engine builds itself with ultralytics'
    parameter groups (engine.musgd_run). AdamW's no-decay groups (biases, BatchNorm) are a function, which
    config.yml cannot hold: the engine adds it while ppdet builds the optimizer (``adamw_decay_groups``)."""
    builder = cfg["OptimizerBuilder"]
    section = builder.get("optimizer") or {}
    if str(section.get("type")) != AUTO_TYPE:
        return []
    nbs = int(nbs or NBS)
    nc, epochs = int(cfg["num_classes"]), int(cfg["epoch"])
    iterations = auto_iterations(len(images), batch.global_batch, epochs, nbs)
    choice = auto_optimizer(nc, iterations)
    decay = float((builder.get("regularizer") or {}).get("factor", HYP["weight_decay"]))
    edit = ppdet_optimizer(choice, decay)
    edit["optimizer"].pop("apply_decay_param_fun", None)   # a function: the run's config.yml must stay plain data
    builder["optimizer"] = edit["optimizer"]
    builder["regularizer"] = edit["regularizer"]
    lr_cfg = cfg["LearningRate"]
    ignored = float(lr_cfg.get("base_lr", HYP["lr0"]))
    lr_cfg["base_lr"] = choice.lr
    cfg["warmup_bias_lr"] = choice.warmup_bias_lr
    cfg["ref_batch"] = lr_reference(choice, batch.effective_batch, nbs)
    return [auto_note(choice, iterations, nc, ignored)]


@contextlib.contextmanager
def adamw_decay_groups(cfg) -> Iterator[bool]:
    """While ppdet's OptimizerBuilder builds an ultralytics model's AdamW (``optimizer=auto``'s choice, or
    ``optimizer=AdamW``), its section carries ``apply_decay_param_fun=decays``: biases and BatchNorm weights
    undecayed, as in ultralytics' groups (SGD and Adam read the layers' own L2Decay(0) on those). Afterwards the
    section is plain data again, as config.yml keeps it. Yields whether it applied: not to other architectures
    (PaddleDetection's AdamW decays every parameter) nor to a section that names its own function."""
    builder = cfg.get("OptimizerBuilder") or {}
    section = builder.get("optimizer") or {}
    applies = (cfg.get("architecture") == "UltraYOLO" and str(section.get("type")) == "AdamW"
               and "apply_decay_param_fun" not in section)
    if not applies:
        yield False
        return
    section["apply_decay_param_fun"] = decays
    try:
        yield True
    finally:
        section.pop("apply_decay_param_fun", None)
