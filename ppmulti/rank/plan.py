"""The RunPlan: what one training run is asked to do, resolved once from its flags (frozen, plain data, JSON)."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

from ppmulti.common.callbacks import CallbackSpec
from ppmulti.common.gpu_switches import Switches
from ppmulti.common.rundir import PLAN_FILE  # noqa: F401  (rank 0 writes the plan into the run directory)

# run_plan.json's section for what rank 0 made of the plan once the ranks' world and data were known (the batch and
# LR plans: engine/made_plan.py), beside the RunPlan's own fields; from_dict reads the RunPlan around it
MADE_SECTION = "made"


@dataclass(frozen=True)
class ConfigEdit:
    """What YOLOv5's flags change on the loaded config, as values (yolo_config.apply_edit applies them in the rank):
    the model (--cfg), data, image size, hyp, optimizer, schedule, --rect (grouped by the batch plan's global
    batch, set in the builder), --mosaic-buffer, label smoothing."""

    cfg: str | None = None
    data: str | None = None
    single_cls: bool = False
    hyp: str | None = None
    imgsz: int | None = None
    optimizer: str | None = None
    cos_lr: bool = False
    rect: bool = False
    mosaic_buffer: int | None = None
    label_smoothing: float | None = None
    every_epoch: bool = False           # YOLOv5 command lines without --noval: validate and save after every epoch


@dataclass(frozen=True)
class RunPlan:
    """One training run, resolved from its command line before any rank starts (``entry.resolve``); every rank
    of a launch reads the same plan (``PPMULTI_RUN_PLAN``) instead of parsing argv again. Plain values and
    tuples only, so it round-trips through JSON (``to_json`` / ``from_json``) and lands in the run directory."""

    config: str
    overrides: tuple[str, ...] = ()
    validate: bool = False          # evaluate every snapshot epoch (a final evaluation always runs)
    resume: str | None = None       # the resume source: a run directory, weights/last, or a ppdet checkpoint stem
    batch: int | None = None        # global batch; default: TrainReader.batch_size x world size
    epochs: int | None = None
    output: str | None = None       # run directory; default: save_dir/<config name>[N] (entry: runs/train/exp)
    exist_ok: bool = False
    sync_bn: bool = False
    seed: int = 0
    workers: int | None = None      # data loader workers per rank
    weights: str | None = None      # initial weights (.pdparams)
    edit: ConfigEdit | None = None  # YOLOv5 flags' edits of the loaded config (yolo_config.apply_edit)
    nosave: bool = False            # checkpoint only after the last epoch (and on an interrupt)
    save_period: int = -1           # also keep weights/epochN every N epochs
    patience: int | None = None     # stop after N validated epochs without a better fitness
    freeze: tuple[int, ...] | None = None  # backbone layers to freeze: (N,) = the first N, else indices
    noplots: bool = False           # no results.png / PR_curve.png (YOLOv5's --noplots; evolution candidates)
    amp: bool | None = None         # --amp / --no-amp; None: the config's amp key, else amp_default
    amp_default: bool = False       # YOLOv5-style runs: AMP on GPUs unless --no-amp or amp: false
    cache: str | None = None        # --cache: "ram" (one copy per node) or "disk" decoded training images
    switches: Switches = field(default_factory=Switches)   # --deterministic / --cudnn-benchmark, as Paddle flags
    record: dict | None = None      # the command line's flags, written as the run's opt.yaml (as YOLOv5 does)
    accumulate: int | None = None   # --accumulate: batches per optimizer step (wins over nominal_batch)
    nominal_batch: int | None = None   # YOLOv5 command lines: 64, accumulate max(round(64 / global batch), 1)
    multi_scale: bool = False       # --multi-scale: every step a random size in [0.5, 1.5] x imgsz, same on all ranks
    image_weights: bool = False     # --image-weights: each epoch's images drawn by class weights (YOLOv5's rule)
    loggers: tuple[str, ...] | None = None   # --logger: trackers (hooks/trackers.py); None: VisualDL unless use_vdl off
    callbacks: tuple[CallbackSpec, ...] = ()   # --callback: users' functions called in every rank (hooks/callbacks.py)
    ultra_args: dict | None = None   # ppmulti yolo runs: ultralytics' keys as resolved, rank 0's args.yaml
    # the evaluation after each epoch, as ultralytics' trainer does it (ppmulti yolo runs: ultra_keys.training_val)
    val_rect: bool = False           # ultralytics' val letterbox, rect batches (yolo_config.apply_val_rect)
    val_end2end: bool | None = None  # YOLO26's head while evaluating: None the config's, False one-to-many + NMS

    def __post_init__(self) -> None:
        # callers (tests, scripts, bench/) may hand lists: the plan keeps tuples, so it is the same after JSON
        for name in ("overrides", "freeze", "loggers", "callbacks"):
            value = getattr(self, name)
            if isinstance(value, list):
                object.__setattr__(self, name, tuple(value))

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "RunPlan":
        return cls.from_dict(json.loads(text))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "RunPlan":
        data = dict(data)
        data.pop(MADE_SECTION, None)
        if data.get("edit") is not None:
            data["edit"] = ConfigEdit(**data["edit"])
        data["switches"] = Switches(**data.get("switches") or {})
        data["callbacks"] = tuple(CallbackSpec(**c) for c in data.get("callbacks") or ())
        return cls(**data)
