"""The one entry point of the rank side that the process side calls: train flags -> a frozen RunPlan -> a run."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from dataclasses import dataclass
from typing import Mapping

from ppmulti.common import gpu_switches, ppdet_flags, trackers, train_flags
from ppmulti.common.callbacks import resolve as resolve_callback
from ppmulti.common.callbacks import spec_from_text
from ppmulti.common.errors import UserError
from ppmulti.common.ultra_keys import training_val
from ppmulti.rank.engine.lr import NOMINAL_BATCH
from ppmulti.rank.engine.resume_plan import Located, locate
from ppmulti.rank.plan import RunPlan


@dataclass(frozen=True)
class Facts:
    """What resolving a command line reads beyond its flags: files, the network, installed packages. ``gather``
    reads them; ``plan_of`` builds the plan from them without any I/O (a test writes them down)."""

    resume: Located = Located(None)     # --resume located (a bare --resume: the newest run, its config.yml kept)
    record: dict | None = None          # that run's opt.yaml (its flags), when it kept one
    weights: str | None = None          # --weights as a file here (a release downloaded or cached; a YOLOv5 line
    #                                     without --weights: the cached release weights); None: as given
    weights_cfg: str | None = None      # the model a --weights .pt names when neither --cfg nor -c is given
    weights_overrides: tuple[str, ...] = ()   # -o items --weights adds (the .pt's own AutoAnchor anchors)
    model_config: str | None = None     # --cfg's ppdet config (yolo_config.resolve_cfg)
    missing_trackers: frozenset[str] = frozenset()   # trackers whose package is not installed
    config_epoch: int | None = None     # a resumed start's -c config's own ``epoch`` (with its _BASE_ files)


def resolve(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> RunPlan:
    """Parsed train flags as the plan of one run, made once in the launching process; every flag is checked here,
    before any process starts. The I/O is here (``gather``: a bare --resume's newest run and its opt.yaml,
    --weights' download, the --cfg model yaml and --hyp read once, installed trackers; --callback functions
    imported; the --imgsz rounding said); the plan itself is ``plan_of``'s, pure. ``environ`` (default
    os.environ): the user's own FLAGS_cudnn_* choices, which --deterministic leaves alone."""
    note = imgsz_note(args)
    if note:
        print(f"WARNING: {note}", file=sys.stderr, flush=True)
    args = checked_values(args)   # a value no run can use is refused before any download
    plan = plan_of(args, gather(args), os.environ if environ is None else environ)
    for spec in plan.callbacks:
        resolve_callback(spec)   # imported as each rank will: a missing module is one line here
    return plan


def gather(args: argparse.Namespace) -> Facts:
    """The facts ``plan_of`` reads, gathered once in the launching process (files, downloads, package look-ups)."""
    from ppmulti.common.hyp import load_hyp
    from ppmulti.rank import yolo_config
    from ppmulti.rank.engine.pretrained import resolve_weights_flag

    asked = args.output or train_flags.run_output(getattr(args, "project", None), getattr(args, "name", None))
    located = locate(args.resume, asked)   # a bare --resume's run; a bad -r stem refused
    record = _read_record(located.run_dir) if located.run_dir is not None else None
    probe = argparse.Namespace(**vars(args))   # resolve_weights_flag edits what it is given
    weights_overrides = resolve_weights_flag(probe)   # YOLOv5's --weights: a release downloaded, a .pt's model
    weights = probe.weights if probe.weights != args.weights else None
    weights_cfg = probe.cfg if probe.cfg != getattr(args, "cfg", None) else None
    cfg = getattr(probe, "cfg", None)
    model_config = yolo_config.resolve_cfg(cfg).config if cfg and not args.config else None
    if getattr(args, "hyp", None) and train_flags.wants_edit(args):
        load_hyp(args.hyp)   # a bad --hyp is one line before any rank starts
    return Facts(resume=located, record=record, weights=weights, weights_cfg=weights_cfg,
                 weights_overrides=tuple(weights_overrides), model_config=model_config,
                 missing_trackers=trackers.missing(),
                 config_epoch=_config_epoch(args.config) if located.progress is not None else None)


def _config_epoch(config: str | None) -> int | None:
    """The ``epoch`` a -c config file sets (its _BASE_ files merged), or None: no file, no such key, or a file the
    rank will refuse in its own words."""
    import yaml

    from ppmulti.common.yamlread import load_config_chain

    if not config or not os.path.isfile(config):
        return None
    try:
        value = load_config_chain(config)[0].get("epoch")
    except (UserError, OSError, yaml.YAMLError):
        return None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def plan_of(args: argparse.Namespace, facts: Facts, environ: Mapping[str, str]) -> RunPlan:
    """The RunPlan of parsed train flags and the facts ``gather`` read (pure: no file, network or import; golden
    cases in tests/test_resolve.py). Every check that needs no I/O is here: a bad value is one UserError line."""
    from ppmulti.rank import yolo_config

    args = checked_values(args)
    overrides = [item for group in (args.opt or []) for item in group]
    overrides += ppdet_flags.resolve(args, "train")   # PaddleDetection's flags, as the -o keys they stand for
    check_train_overrides(overrides)
    loggers = _loggers(args, facts.missing_trackers)
    if getattr(args, "enable_ce", None):
        if args.seed != 0:
            raise UserError(f"--enable_ce seeds with 0 (PaddleDetection's continuous evaluation) but --seed "
                            f"{args.seed} asks for another; give one of them")
    config = args.config
    yolo_style = train_flags.yolo_style(args)
    project, name = getattr(args, "project", None), getattr(args, "name", None)
    asked = args.output or train_flags.run_output(project, name)   # a run directory the user named
    resume = facts.resume.path
    wanted = epochs_wanted(args.epochs, overrides)
    # fewer than done (the flags', else the -c config's own epoch): refused before any rank starts
    facts.resume.check_epochs(wanted if wanted is not None else facts.config_epoch)
    noval = getattr(args, "noval", False)
    args = _with_weights(args, facts)
    overrides += list(facts.weights_overrides)
    if getattr(args, "cfg", None):
        if args.config:
            raise UserError(f"give the model once: -c {args.config} or --cfg {args.cfg}, not both")
        if facts.model_config is None:
            raise ValueError(f"--cfg {args.cfg}: Facts.model_config not given (gather resolves it)")
        config = facts.model_config
    elif not config and facts.resume.run_dir is not None:
        # YOLOv5's bare --resume needs no other flag: the run's own resolved config (and its opt.yaml) say it all
        config = str(facts.resume.run_dir / "config.yml")
        if facts.record is not None:
            args = _with_record(args, facts.record)
            loggers = _loggers(args, facts.missing_trackers)
            yolo_style, noval = True, bool(getattr(args, "noval", False))
    if not config:
        raise UserError("no config given: pass -c CONFIG (e.g. -c configs/yolo.yml) "
                        "or --cfg MODEL (e.g. --cfg yolov5s)")
    weights = args.weights
    if weights == "":
        overrides.append("pretrain_weights=")   # YOLOv5's --weights '': from scratch
        weights = None
    output = asked or train_flags.run_output(project, name, yolo=yolo_style)
    validate = args.eval or (yolo_style and not noval)
    if getattr(args, "patience", None) and not validate:
        raise UserError("--patience needs validation every epoch: drop --noval (or add --eval)")
    if getattr(args, "accumulate", None) is not None and args.accumulate < 1:
        raise UserError(f"--accumulate {args.accumulate}: give 1 (no accumulation) or more batches per optimizer step")
    ultra_args = _ultra_args(environ)
    # a run from ultralytics' line evaluates as its trainer does; YOLOv5 and PaddleDetection lines as their configs
    val_rect, val_end2end = training_val(ultra_args) if ultra_args is not None else (False, None)
    return RunPlan(config=config, overrides=tuple(overrides), validate=validate, resume=resume,
                   batch=args.batch, epochs=args.epochs, output=output, exist_ok=args.exist_ok,
                   sync_bn=args.sync_bn, seed=args.seed, workers=args.workers, weights=weights,
                   edit=yolo_config.edit_of(args),
                   nosave=getattr(args, "nosave", False), save_period=getattr(args, "save_period", -1),
                   patience=getattr(args, "patience", None), freeze=_tuple(getattr(args, "freeze", None)),
                   noplots=getattr(args, "noplots", False), amp=getattr(args, "amp", None),
                   amp_default=yolo_style, cache=getattr(args, "cache", None),
                   accumulate=getattr(args, "accumulate", None),
                   nominal_batch=NOMINAL_BATCH if yolo_style else None,
                   multi_scale=getattr(args, "multi_scale", False),
                   image_weights=getattr(args, "image_weights", False),
                   switches=gpu_switches.resolve(getattr(args, "deterministic", None),
                                                 bool(getattr(args, "cudnn_benchmark", False)), yolo_style,
                                                 environ),
                   record=run_record(args) if train_flags.yolo_style(args) else None, loggers=loggers,
                   callbacks=tuple(spec_from_text(c) for c in getattr(args, "callback", None) or ()),
                   ultra_args=ultra_args, val_rect=val_rect, val_end2end=val_end2end)


def epochs_wanted(epochs: int | None, overrides: list[str]) -> int | None:
    """The epochs a start trains to as its flags say: --epochs, else the last ``-o epoch=N`` (None: the config's,
    which the rank reads)."""
    if epochs is not None:
        return int(epochs)
    from ppmulti.common.flags import parse_overrides

    value = parse_overrides(overrides).get("epoch")
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _with_weights(args: argparse.Namespace, facts: Facts) -> argparse.Namespace:
    """``args`` with --weights as gathered (the file here) and the model its .pt names, as the run records them."""
    changes = {}
    if facts.weights is not None:
        changes["weights"] = facts.weights
    if facts.weights_cfg is not None:
        changes["cfg"] = facts.weights_cfg
    return argparse.Namespace(**{**vars(args), **changes}) if changes else args


MAX_STRIDE = 32   # the largest stride of every model ppmulti builds (P5 heads: P3/8, P4/16, P5/32)


def rounded_imgsz(imgsz: int, stride: int = MAX_STRIDE) -> int:
    """YOLOv5's rule for a training size: up to a multiple of the max stride, and at least two strides."""
    return max(math.ceil(imgsz / stride) * stride, 2 * stride)


def imgsz_note(args: argparse.Namespace) -> str | None:
    """What YOLOv5 says when it rounds the training size (``resolve`` prints it once); None: nothing to round."""
    imgsz = getattr(args, "imgsz", None)
    if imgsz is None or rounded_imgsz(imgsz) == imgsz:
        return None
    return (f"--imgsz {imgsz} must be a multiple of the max stride {MAX_STRIDE} (at least {2 * MAX_STRIDE}); "
            f"training at --imgsz {rounded_imgsz(imgsz)}")


def checked_values(args: argparse.Namespace) -> argparse.Namespace:
    """The numbers of the train flags checked before any rank starts (pure): a value no run can use is one line
    naming the flag and the fix; an image size YOLOv5 would round is rounded as it does (``imgsz_note`` says so)."""
    imgsz = getattr(args, "imgsz", None)
    if imgsz is not None and rounded_imgsz(imgsz) != imgsz:
        args = argparse.Namespace(**{**vars(args), "imgsz": rounded_imgsz(imgsz)})
    at_least_one = {"epochs": "--epochs {}: train at least 1 epoch",
                    "batch": "--batch {}: give the global batch, at least 1, e.g. --batch 64 (AutoBatch, YOLOv5's "
                             "--batch -1, is not implemented: ppmulti splits the global batch across ranks)"}
    for key, message in at_least_one.items():
        value = getattr(args, key, None)
        if value is not None and value < 1:
            raise UserError(message.format(value))
    not_negative = {"workers": "--workers {}: give 0 (load in the training process) or more worker processes",
                    "patience": "--patience {}: give 0 (never stop early) or a number of epochs",
                    "seed": "--seed {}: give a seed of 0 or more (rank r seeds with SEED + r)"}
    for key, message in not_negative.items():
        value = getattr(args, key, None)
        if value is not None and value < 0:
            raise UserError(message.format(value))
    freeze = getattr(args, "freeze", None)
    if freeze and min(freeze) < 0:
        raise UserError(f"--freeze {' '.join(map(str, freeze))}: give the number of backbone layers to freeze "
                        f"(10: YOLOv5's whole backbone) or layer indices from 0")
    smoothing = getattr(args, "label_smoothing", None)
    if smoothing is not None and not 0 <= smoothing < 1:
        raise UserError(f"--label-smoothing {smoothing}: give an epsilon from 0 to below 1, e.g. 0.1")
    return args




def _ultra_args(environ: Mapping[str, str]) -> dict | None:
    """The ultralytics keys `ppmulti yolo train` resolved (PPMULTI_ULTRA_ARGS), for the run's args.yaml."""
    from ppmulti.common.envvars import PPMULTI_ULTRA_ARGS

    text = environ.get(PPMULTI_ULTRA_ARGS)
    if not text:
        return None
    try:
        keys = json.loads(text)
    except ValueError:
        raise UserError(f"{PPMULTI_ULTRA_ARGS} is not the JSON `ppmulti yolo` writes; unset it") from None
    return keys if isinstance(keys, dict) else None


def _tuple(value) -> tuple | None:
    return None if value is None else tuple(value)


def _loggers(args: argparse.Namespace, missing: frozenset[str]) -> tuple[str, ...] | None:
    """--logger's trackers; a missing package is one line here, before any process or model."""
    loggers = trackers.parse(getattr(args, "logger", None))
    trackers.refuse_missing(loggers or (), missing)
    return loggers


# the flags a bare YOLOv5 --resume takes back from the run's opt.yaml unless given again (YOLOv5 restores them all;
# the model, data, size and hyperparameters are in config.yml already)
RESUMED_FLAGS = ("noval", "nosave", "save_period", "patience", "freeze", "noplots", "seed", "deterministic",
                 "cudnn_benchmark", "amp", "sync_bn", "workers", "cache", "rect", "multi_scale",
                 "image_weights", "logger")


def _with_record(args: argparse.Namespace, record: dict) -> argparse.Namespace:
    defaults = vars(train_flags.build_parser().parse_args([]))
    merged = argparse.Namespace(**vars(args))
    for key in RESUMED_FLAGS:
        if key in record and getattr(merged, key, None) == defaults.get(key):
            setattr(merged, key, record[key])
    return merged


def _read_record(run) -> dict | None:
    import yaml

    try:
        record = yaml.safe_load((run / "opt.yaml").read_text())
    except (OSError, yaml.YAMLError):
        return None
    return record if isinstance(record, dict) else None


def run_record(args: argparse.Namespace) -> dict:
    """The flags as YOLOv5 keeps them in a run's opt.yaml (plain values), with the model it trains named."""
    record = {k: v for k, v in sorted(vars(args).items()) if isinstance(v, (str, int, float, bool, list, type(None)))}
    record["model"] = args.cfg or args.config
    return record


# -o keys PaddleDetection's train.py reads that ppmulti's training refuses (tools/eval.py honours them)
TRAIN_REFUSED_KEYS = {
    "save_prediction_only": "ppmulti keeps the best weights by each evaluation's mAP, so training scores every "
                            "evaluation; write predictions without scoring with tools/eval.py --save_prediction_only",
}


def check_train_overrides(overrides: list[str]) -> None:
    """Refuse, by name, -o keys whose meaning training cannot honour (a false value asks for nothing)."""
    from ppmulti.common.flags import parse_overrides
    from ppmulti.common.numbers import check_numbers

    parsed = parse_overrides(overrides)
    check_numbers(parsed)   # -o TrainReader.batch_size=abc: one line here, before any rank imports Paddle
    for key, value in parsed.items():
        if key in TRAIN_REFUSED_KEYS and value not in (False, None, "", 0):
            raise UserError(f"-o {key}={value}: {TRAIN_REFUSED_KEYS[key]}")


def check_gpu_ids(ids: list[int]) -> None:
    from ppmulti.rank import compat

    count = compat.usable_gpu_count()
    bad = [i for i in ids if i >= count]
    if bad:
        raise UserError(f"--device {','.join(map(str, ids))}: GPU {bad[0]} does not exist "
                        f"(this machine has {count} usable GPU(s)); use --device cpu or ids below {count}")


def train(options: RunPlan) -> int:
    """Train one run in this process (alone, or as one rank of a launch); rank 0 prints the summary JSON."""
    from ppmulti.rank import dist
    from ppmulti.rank.engine.builder import train as run_training

    metrics = run_training(options)
    if dist.is_main():
        print(json.dumps({k: metrics[k] for k in ("mAP50", "mAP50_95", "run_dir") if k in metrics}))
    return 0


def with_device(args: argparse.Namespace) -> tuple[str, list[int], int]:
    """``--device``/``--nproc`` -> (kind, gpu ids, ranks); cpu or gpu ids also set the config's use_gpu."""
    kind, ids, nranks = train_flags.parse_device(args.device, args.nproc)
    if kind in ("cpu", "gpu"):
        args.opt = list(args.opt or []) + [[f"use_gpu={'true' if kind == 'gpu' else 'false'}"]]
    return kind, ids, nranks


def resolve_script_args(script_args: list[str], environ: Mapping[str, str] | None = None) -> RunPlan | None:
    """``ppmulti launch ... tools/train.py ARGS``: ARGS resolved into the RunPlan every rank will train, before any
    rank starts (a bad value is one line here); None for --evolve, which resolves each candidate itself."""
    args = train_flags.parse(list(script_args))
    if getattr(args, "evolve", None) is not None:
        return None
    with_device(args)
    return resolve(args, environ)


def plan_message(plan: RunPlan, script_args: list[str]) -> str:
    """PPMULTI_RUN_PLAN's value: the plan and the train script's arguments it was resolved from (a rank started
    with other arguments resolves its own)."""
    return json.dumps({"argv": list(script_args), "plan": json.loads(plan.to_json())}, sort_keys=True)


def plan_from_environ(argv: list[str], environ=None) -> RunPlan | None:
    """In a rank of a launch: the plan its launcher resolved for exactly these arguments; None when run alone."""
    from ppmulti.common.envvars import PPMULTI_RUN_PLAN, in_paddle_worker

    env = os.environ if environ is None else environ
    text = env.get(PPMULTI_RUN_PLAN)
    if not text or not in_paddle_worker(env):
        return None
    message = json.loads(text)
    if message.get("argv") != list(argv):
        return None
    return RunPlan.from_dict(message["plan"])
