"""PaddleDetection's tool flags (tools/train.py, eval.py, infer.py, export_model.py): one table saying, per tool, what
each maps onto in ppmulti or why it is refused; it builds the flags into each tool's parser and resolves them."""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass

from ppmulti.common.errors import UserError
from ppmulti.common.flags import twins

TOOLS = ("train", "eval", "infer", "export")

# how a flag takes its value: "bool" (bare = true, or true/false/1/0 after it: PaddleDetection spells some as
# store_true, others as type=bool with a value), "str", "any" (refused flags: whatever values follow)
BOOL, STR, ANY = "bool", "str", "any"


@dataclass(frozen=True)
class Use:
    """What a flag does in one tool: ``key`` sets that config key as ``-o key=value`` would (PaddleDetection's
    merge_args puts its flags into the config the same way); ``tool`` is read by the tool itself (its dest);
    ``noop`` changes nothing, for the reason given; ``refuse`` stops with the reason given."""

    kind: str            # key | tool | noop | refuse
    text: str = ""       # the config key (key), or the reason (noop, refuse)


def key(name: str) -> Use:
    return Use("key", name)


def refuse(why: str) -> Use:
    return Use("refuse", why)


TOOL = Use("tool")

SLIM = refuse("PaddleSlim's compression wraps PaddleDetection's own Trainer: run PaddleDetection's tools for a slim "
              "model")
SLICE = refuse("sliced inference (ppdet's slice_infer) is not implemented; use whole images")
NOT_VDL_IMAGES = refuse("drawn images go to --output_dir as PNGs, not to VisualDL")


@dataclass(frozen=True)
class Flag:
    spellings: tuple[str, ...]
    value: str
    uses: dict                     # tool -> Use
    help: str

    @property
    def dest(self) -> str:
        return self.spellings[0].lstrip("-").replace("-", "_")

    @property
    def names(self) -> tuple[str, ...]:
        """PaddleDetection's spelling and its dash twin (the dialect rule of ppmulti.common.flags)."""
        return twins(self.spellings)


FLAGS: tuple[Flag, ...] = (
    # --- train ---
    Flag(("--use_vdl",), BOOL, {"train": key("use_vdl"), "infer": NOT_VDL_IMAGES},
         "VisualDL log (-o use_vdl): ppmulti writes one by default, under RUN_DIR/vdl; --use_vdl false turns it off"),
    Flag(("--vdl_log_dir",), STR, {"train": key("vdl_log_dir"), "infer": NOT_VDL_IMAGES},
         "where the VisualDL log goes (-o vdl_log_dir; default RUN_DIR/vdl)"),
    Flag(("--fleet",), BOOL, {"train": Use("noop", "ppmulti always trains collectively through fleet.init when "
                                                   "launched, as PaddleDetection does with --fleet")},
         "accepted and changes nothing: ppmulti always trains collectively through fleet when launched"),
    Flag(("--enable_ce",), BOOL, {"train": TOOL},
         "PaddleDetection's continuous-evaluation seeds: the same as --seed 0 (ppmulti always seeds; 0 is the "
         "default)"),
    Flag(("--profiler_options",), STR, {"train": key("profiler_options")},
         "paddle.profiler over some steps, e.g. \"batch_range=[10,20];profile_path=p.json\": a Chrome trace per "
         "rank, the summary on the console, then the run stops (-o profiler_options; PaddleDetection's keys)"),
    Flag(("--slim_config",), ANY, {t: SLIM for t in TOOLS}, "refused: QAT, pruning and distillation are not built"),
    Flag(("--use_wandb",), ANY, {"train": refuse("Weights & Biases logging; ppmulti logs to VisualDL")},
         "refused: W&B logging"),
    Flag(("--save_proposals",), ANY, {"train": refuse("SNIPER's proposal files; ppmulti does not train SNIPER")},
         "refused: SNIPER proposals"),
    Flag(("--proposals_path",), ANY, {"train": refuse("SNIPER's proposal files; ppmulti does not train SNIPER")},
         "refused: SNIPER proposals"),
    Flag(("--to_static",), ANY, {"train": refuse("dynamic-to-static training; ppmulti trains in dynamic mode")},
         "refused: dy2st training"),
    # --- train and eval ---
    Flag(("--save_prediction_only",), BOOL, {
        "eval": key("save_prediction_only"),
        "train": refuse("ppmulti keeps the best weights by each evaluation's mAP, so it scores every "
                        "evaluation; write predictions without scoring with tools/eval.py --save_prediction_only")},
         "eval: write bbox.json (into --output_eval, else the current directory) and skip the scoring "
         "(-o save_prediction_only)"),
    # --- eval ---
    Flag(("--output_eval",), STR, {"eval": key("output_eval")},
         "directory for bbox.json, every evaluated image's detections in COCO form (-o output_eval)"),
    Flag(("--classwise",), BOOL, {"eval": key("classwise")},
         "print the AP of every category after the COCO summary (-o classwise)"),
    Flag(("--json_eval",), ANY, {"eval": refuse("re-scoring an existing bbox.json is not implemented; evaluate "
                                                "the weights again")}, "refused: re-scoring bbox.json"),
    Flag(("--bias",), ANY, {"eval": refuse("ppdet's +1 pixel box convention; boxes are scored as "
                                           "they are")}, "refused"),
    Flag(("--amp",), ANY, {"eval": refuse("evaluation runs in float32 (mixed precision is a training option, "
                                          "tools/train.py --amp)")}, "refused: evaluation runs in float32"),
    Flag(("--slice_infer",), ANY, {"eval": SLICE, "infer": SLICE}, "refused: sliced inference"),
    Flag(("--slice_size",), ANY, {"eval": SLICE, "infer": SLICE}, "refused: sliced inference"),
    Flag(("--overlap_ratio",), ANY, {"eval": SLICE, "infer": SLICE}, "refused: sliced inference"),
    Flag(("--combine_method",), ANY, {"eval": SLICE, "infer": SLICE}, "refused: sliced inference"),
    Flag(("--match_threshold",), ANY, {"eval": SLICE, "infer": SLICE}, "refused: sliced inference"),
    Flag(("--match_metric",), ANY, {"eval": SLICE, "infer": SLICE}, "refused: sliced inference"),
    # --- infer ---
    Flag(("--save_results",), BOOL, {"infer": TOOL},
         "accepted: ppmulti always writes the results, detections.json in --output_dir (false is refused)"),
    Flag(("--visualize",), BOOL, {"infer": TOOL},
         "accepted: ppmulti always writes the drawn images as PNGs in --output_dir (false is refused)"),
    # --- export ---
    Flag(("--export_serving_model",), BOOL, {"export": TOOL},
         "refused when true: Paddle Serving's model needs paddle_serving_client, which ppmulti does not use"),
)


def parse_bool(text: str) -> bool:
    low = str(text).strip().lower()
    if low in ("true", "1", "yes", "on"):
        return True
    if low in ("false", "0", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def flags_for(tool: str) -> list[Flag]:
    return [f for f in FLAGS if tool in f.uses]


def add_ppdet_flags(p: argparse.ArgumentParser, tool: str) -> None:
    """The PaddleDetection flags of ``tool`` as one argument group (refused ones too, so --help names them)."""
    g = p.add_argument_group(f"PaddleDetection tools/{'export_model' if tool == 'export' else tool}.py flags")
    for flag in flags_for(tool):
        use = flag.uses[tool]
        text = f"refused: {use.text}" if use.kind == "refuse" else flag.help
        if flag.value == BOOL:
            g.add_argument(*flag.names, dest=flag.dest, nargs="?", const=True, default=None, type=parse_bool,
                           metavar="BOOL", help=text)
        elif flag.value == STR:
            g.add_argument(*flag.names, dest=flag.dest, default=None, metavar="VALUE", help=text)
        else:
            g.add_argument(*flag.names, dest=flag.dest, nargs="*", default=None, metavar="VALUE", help=text)


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
            raise UserError(f"{flag.spellings[0]} is a PaddleDetection flag that ppmulti does not support: "
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
    return [(flag.spellings[0], flag.uses[tool].kind, flag.uses[tool].text or flag.help) for flag in flags_for(tool)]
