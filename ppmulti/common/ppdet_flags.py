"""PaddleDetection's tool flags (tools/train.py, eval.py, infer.py, export_model.py): one table saying, per tool, what
each maps onto in ppmulti or why it is refused; it builds the flags into each tool's parser and resolves them."""

from __future__ import annotations

import argparse
import json

from ppmulti.common.errors import UserError
from ppmulti.common.flags import TOOL, Flag, Use, key, refuse

TOOLS = ("train", "eval", "infer", "export")


def parse_bool(text: str) -> bool:
    low = str(text).strip().lower()
    if low in ("true", "1", "yes", "on"):
        return True
    if low in ("false", "0", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


# How a flag takes its value, as argparse's keywords. BOOL: bare = true, or true/false/1/0 after it
# (PaddleDetection spells some as store_true, others as type=bool with a value); STR: one value; ANY (refused
# flags): whatever values follow.
BOOL = {"nargs": "?", "const": True, "default": None, "type": parse_bool, "metavar": "BOOL"}
STR = {"default": None, "metavar": "VALUE"}
ANY = {"nargs": "*", "default": None, "metavar": "VALUE"}


def _p(names: tuple[str, ...], value: dict, uses: dict, help: str) -> Flag:
    """A PaddleDetection flag: its own spelling (the dash twin comes along), dest from the spelling, its use per
    tool (the tools that take it)."""
    return Flag(names, names[0].lstrip("-").replace("-", "_"), help, tuple(uses), value, ppdet=names, uses=uses)


SLIM = refuse("PaddleSlim's compression wraps PaddleDetection's own Trainer: run PaddleDetection's tools for a slim "
              "model")
SLICE = refuse("sliced inference (ppdet's slice_infer) is not implemented; use whole images")
NOT_VDL_IMAGES = refuse("drawn images go to --output_dir as PNGs, not to VisualDL")


FLAGS: tuple[Flag, ...] = (
    # --- train ---
    _p(("--use_vdl",), BOOL, {"train": key("use_vdl"), "infer": NOT_VDL_IMAGES},
       "VisualDL log (-o use_vdl): ppmulti writes one by default, under RUN_DIR/vdl; --use_vdl false turns it off"),
    _p(("--vdl_log_dir",), STR, {"train": key("vdl_log_dir"), "infer": NOT_VDL_IMAGES},
       "where the VisualDL log goes (-o vdl_log_dir; default RUN_DIR/vdl)"),
    _p(("--fleet",), BOOL, {"train": Use("noop", "ppmulti always trains collectively through fleet.init when "
                                                 "launched, as PaddleDetection does with --fleet")},
       "accepted and changes nothing: ppmulti always trains collectively through fleet when launched"),
    _p(("--enable_ce",), BOOL, {"train": TOOL},
       "PaddleDetection's continuous-evaluation seeds: the same as --seed 0 (ppmulti always seeds; 0 is the "
       "default)"),
    _p(("--profiler_options",), STR, {"train": key("profiler_options")},
       "paddle.profiler over some steps, e.g. \"batch_range=[10,20];profile_path=p.json\": a Chrome trace per "
       "rank, the summary on the console, then the run stops (-o profiler_options; PaddleDetection's keys)"),
    _p(("--slim_config",), ANY, {t: SLIM for t in TOOLS}, "refused: QAT, pruning and distillation are not built"),
    _p(("--use_wandb",), ANY, {"train": refuse("Weights & Biases logging; ppmulti logs to VisualDL")},
       "refused: W&B logging"),
    _p(("--save_proposals",), ANY, {"train": refuse("SNIPER's proposal files; ppmulti does not train SNIPER")},
       "refused: SNIPER proposals"),
    _p(("--proposals_path",), ANY, {"train": refuse("SNIPER's proposal files; ppmulti does not train SNIPER")},
       "refused: SNIPER proposals"),
    _p(("--to_static",), ANY, {"train": refuse("dynamic-to-static training; ppmulti trains in dynamic mode")},
       "refused: dy2st training"),
    # --- train and eval ---
    _p(("--save_prediction_only",), BOOL, {
        "eval": key("save_prediction_only"),
        "train": refuse("ppmulti keeps the best weights by each evaluation's mAP, so it scores every "
                        "evaluation; write predictions without scoring with tools/eval.py --save_prediction_only")},
       "eval: write bbox.json (into --output_eval, else the current directory) and skip the scoring "
       "(-o save_prediction_only)"),
    # --- eval ---
    _p(("--output_eval",), STR, {"eval": key("output_eval")},
       "directory for bbox.json, every evaluated image's detections in COCO form (-o output_eval)"),
    _p(("--classwise",), BOOL, {"eval": key("classwise")},
       "print the AP of every category after the COCO summary (-o classwise)"),
    _p(("--json_eval",), ANY, {"eval": refuse("re-scoring an existing bbox.json is not implemented; evaluate "
                                              "the weights again")}, "refused: re-scoring bbox.json"),
    _p(("--bias",), ANY, {"eval": refuse("ppdet's +1 pixel box convention; boxes are scored as "
                                         "they are")}, "refused"),
    _p(("--amp",), ANY, {"eval": refuse("evaluation runs in float32 (mixed precision is a training option, "
                                        "tools/train.py --amp)")}, "refused: evaluation runs in float32"),
    _p(("--slice_infer",), ANY, {"eval": SLICE, "infer": SLICE}, "refused: sliced inference"),
    _p(("--slice_size",), ANY, {"eval": SLICE, "infer": SLICE}, "refused: sliced inference"),
    _p(("--overlap_ratio",), ANY, {"eval": SLICE, "infer": SLICE}, "refused: sliced inference"),
    _p(("--combine_method",), ANY, {"eval": SLICE, "infer": SLICE}, "refused: sliced inference"),
    _p(("--match_threshold",), ANY, {"eval": SLICE, "infer": SLICE}, "refused: sliced inference"),
    _p(("--match_metric",), ANY, {"eval": SLICE, "infer": SLICE}, "refused: sliced inference"),
    # --- infer ---
    _p(("--save_results",), BOOL, {"infer": TOOL},
       "accepted: ppmulti always writes the results, detections.json in --output_dir (false is refused)"),
    _p(("--visualize",), BOOL, {"infer": TOOL},
       "accepted: ppmulti always writes the drawn images as PNGs in --output_dir (false is refused)"),
    # --- export ---
    _p(("--export_serving_model",), BOOL, {"export": TOOL},
       "refused when true: Paddle Serving's model needs paddle_serving_client, which ppmulti does not use"),
)


def flags_for(tool: str) -> list[Flag]:
    return [f for f in FLAGS if tool in f.uses]


def add_ppdet_flags(p: argparse.ArgumentParser, tool: str) -> None:
    """The PaddleDetection flags of ``tool`` as one argument group (refused ones too, so --help names them)."""
    g = p.add_argument_group(f"PaddleDetection tools/{'export_model' if tool == 'export' else tool}.py flags")
    for flag in flags_for(tool):
        use = flag.uses[tool]
        flag.add_to(g, help=f"refused: {use.text}" if use.kind == "refuse" else None)


def resolve(args: argparse.Namespace, tool: str) -> list[str]:
    """The ``-o`` items the given PaddleDetection flags stand for; a refused flag raises UserError by name.
    Flags the tool reads itself (``Use.kind == "tool"``) are left on ``args``."""
    items = []
    for flag in flags_for(tool):
        value = getattr(args, flag.dest, None)
        if value is None:
            continue
        use = flag.uses[tool]
        if use.kind == "refuse":
            raise UserError(f"{flag.names[0]} is a PaddleDetection flag that ppmulti does not support: "
                            f"{use.text}; remove it")
        if use.kind == "key":
            items.append(f"{use.text}={_yaml_value(value)}")
    return items


def _yaml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return json.dumps(str(value))   # a quoted YAML string: a path stays a path


def table(tool: str) -> list[tuple[str, str, str]]:
    """(flag, what ppmulti does, text) rows of ``tool``: for the docs and the tests."""
    return [(flag.names[0], flag.uses[tool].kind, flag.uses[tool].text or flag.help) for flag in flags_for(tool)]
