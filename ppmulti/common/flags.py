"""The one Flag class of every flag table, the table of flags several tools share (each dialect's spellings), -o."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field, replace
from typing import Any, Iterable

import yaml

from ppmulti.common.errors import UserError

# The tools that build a parser; a Flag names the ones that take it (tests/test_flags_table.py checks each
# parser against this). "eval" is also tools/val.py (YOLOv5's name, the same parser).
TOOLS = ("train", "eval", "detect", "infer", "export", "export_model", "convert_yolov5", "demo", "data_demo",
         "bench", "evolve", "board", "launch")

# Dialect rules, applied to every flag of the table (so a tool cannot speak half a dialect):
# - YOLOv5 spells its flags with dashes (--exist-ok) and, as torchrun does, ppmulti takes the underscore twin
#   (--exist_ok) too; PaddleDetection spells its with underscores (--output_dir), so the dash twin comes along.
# - PaddleDetection's short names (-c CONFIG, -o KEY=VALUE) and its own long names stay as it has them.
# A tool passes its own help text (and default) where the meaning differs; never its own spellings, dest or type.


def twins(names: tuple[str, ...]) -> tuple[str, ...]:
    """Each long name followed by its dash/underscore twin, in order, once each."""
    out: list[str] = []
    for name in names:
        twin = name
        if name.startswith("--"):
            body = name[2:]
            twin = "--" + (body.replace("-", "_") if "-" in body else body.replace("_", "-"))
        for item in (name, twin):
            if item not in out:
                out.append(item)
    return tuple(out)


def square_size(values, flag: str = "--imgsz") -> int | None:
    """``--imgsz 640`` or ``--imgsz 640 640`` (YOLOv5's h, w) as one side; other shapes refused by name."""
    if values is None or isinstance(values, int):
        return values
    if not values:
        return None
    if len(values) > 2 or len(set(values)) != 1:
        raise UserError(f"{flag} {' '.join(map(str, values))}: give one size (square inputs only), e.g. "
                        f"{flag} {max(values)}")
    return values[0]


class SquareSize(argparse.Action):
    """An image size given as one side or YOLOv5's h w pair, stored as one int."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, square_size(values, option_string or "--imgsz"))


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

# argparse actions that take no value after the flag (a launch flag before the script is split on this)
_BARE_ACTIONS = ("store_true", "store_false", "store_const", "append_const", "count", "help", "version")


@dataclass(frozen=True)
class Flag:
    """One flag, described once, whichever table holds it (this module's shared one, ppdet_flags', launch's,
    train_flags'): its spellings, dest, help, how argparse reads its value, the tools that take it and what it does
    in each."""

    names: tuple[str, ...]          # as each dialect spells it, the first shown first; twins() adds the rest
    dest: str
    help: str
    tools: tuple[str, ...] = ()
    value: dict = field(default_factory=dict)   # type / action / nargs / const / choices / default / metavar
    ppdet: tuple[str, ...] = ()     # the names that are PaddleDetection's own spelling
    exact: tuple[str, ...] = ()     # names taken as their tool spells them, with no twin (Paddle's --max_restart)
    uses: dict = field(default_factory=dict)    # tool -> Use, where the flag means more than its dest
    group: str = ""                 # the --help section a table shows the row under ("": the parser's own options)

    @property
    def spellings(self) -> tuple[str, ...]:
        """Every spelling argparse takes: the names with their twins, then the exact ones."""
        return twins(self.names) + tuple(n for n in self.exact if n not in twins(self.names))

    @property
    def takes_value(self) -> bool:
        """Whether a value follows the flag on the command line."""
        action = self.value.get("action")
        if isinstance(action, type) and issubclass(action, argparse.BooleanOptionalAction):
            return False
        return action not in _BARE_ACTIONS and self.value.get("nargs") != 0

    def told(self, help: str | None = None, **value) -> Flag:
        """The same flag with a tool's own help text or value keywords (metavar, default) where its meaning differs."""
        return replace(self, help=self.help if help is None else help, value={**self.value, **value})

    def refuses(self, tool: str) -> bool:
        """Whether ``tool`` refuses the flag by name (a refusal row: never added to that tool's parser)."""
        use = self.uses.get(tool)
        return use is not None and use.kind == "refuse"

    def add_to(self, p, help: str | None = None, **value) -> argparse.Action:
        """Add the flag to parser or group ``p`` in every spelling (``help`` / ``value``: a tool's own)."""
        kw = {**self.value, **value}
        if isinstance(kw.get("default"), list):
            kw["default"] = list(kw["default"])   # argparse appends to the default it is given: one list a parser
        return p.add_argument(*self.spellings, dest=self.dest, help=self.help if help is None else help, **kw)


def refusal(tool: str, names: tuple[str, ...], why: str, **value) -> Flag:
    """A flag of another program (YOLOv5's train.py, detect.py, val.py, export.py; torchrun; Paddle's launcher) that
    ``tool`` does not implement: a row refused by name with ``why`` (what it does there, or the way out), spelled
    exactly as that program spells it (no twins added), ``value`` its argparse keywords there (whether a value follows
    it). Never added to the tool's parser: the tool checks its leftovers against its refusal rows."""
    return Flag((), names[0].lstrip("-").replace("-", "_"), why, (tool,), value, exact=names,
                uses={tool: refuse(why)})


def refusals(rows: Iterable[Flag], tool: str) -> dict[str, str]:
    """Spelling -> why, of each of ``rows`` that ``tool`` refuses."""
    return {name: flag.uses[tool].text for flag in rows if flag.refuses(tool) for name in flag.spellings}


def _f(names, dest, help, tools, ppdet=(), **value) -> Flag:
    return Flag(tuple(names), dest, help, tuple(tools), value, tuple(ppdet))


MODEL_TOOLS = ("train", "eval", "detect", "infer", "export", "export_model")

FLAGS: tuple[Flag, ...] = (
    # --- the model: PaddleDetection's -c/-o and YOLOv5's --weights/--cfg/--data ---
    _f(("-c", "--config"), "config", "ppdet YAML config, e.g. configs/yolo.yml", (*MODEL_TOOLS, "demo"),
       ppdet=("-c", "--config")),
    _f(("-o", "--opt"), "opt", "override config values, e.g. -o epoch=10 TrainReader.batch_size=4",
       (*MODEL_TOOLS, "demo"), ppdet=("-o", "--opt"), action="append", nargs="+", default=[], metavar="KEY=VALUE"),
    _f(("--weights",), "weights", "a .pdparams file or a run directory (uses weights/best)", MODEL_TOOLS),
    _f(("--cfg",), "cfg", "model: a name (yolov5s, ppyoloe_s), a YOLOv5 model yaml or a ppdet .yml",
       ("train", "eval", "export", "convert_yolov5")),
    _f(("--data",), "data", "a YOLOv5 data yaml (path/train/val/nc/names) or a ppdet dataset .yml",
       ("train", "eval", "export", "demo", "bench")),
    _f(("--imgsz", "--img", "--img-size"), "imgsz",
       "image size in pixels, square, a multiple of 32 (YOLOv5's h w pair: both the same)",
       ("train", "eval", "detect", "export", "bench"), type=int, nargs="+", action=SquareSize),
    _f(("--batch", "--batch-size"), "batch", "GLOBAL batch size, split evenly across ranks (e.g. 64)",
       ("train", "eval", "export", "demo", "bench"), type=int),
    # --- devices and processes ---
    _f(("--device",), "device", "cpu, one GPU id (0) or several (0,1,2,3)", ("train", "eval", "detect", "export",
                                                                            "launch")),
    _f(("--devices",), "devices", "GPU ids, e.g. 0,1", ("evolve", "launch")),
    _f(("--nproc",), "nproc", "with --device cpu: number of CPU ranks to start (gloo)", ("train", "demo"),
       type=int),
    _f(("--workers",), "workers", "data loader worker processes per rank", ("train", "eval", "bench", "evolve"),
       type=int),
    _f(("--seed",), "seed", "random seed", ("train", "data_demo", "evolve"), type=int, default=0),
    # --- where results go ---
    _f(("--project",), "project", "results go to PROJECT/NAME", ("train", "eval", "detect", "evolve")),
    _f(("--name",), "name", "results go to PROJECT/NAME, NAME2, ... (default exp)", ("train", "eval", "detect")),
    _f(("--exist-ok",), "exist_ok", "write into an existing PROJECT/NAME instead of the next free one",
       ("train", "eval", "detect"), action="store_true"),
    _f(("--output",), "output", "run directory", ("train", "demo"), metavar="DIR"),
    _f(("--output_dir",), "output_dir", "where the exported or drawn files go", ("infer", "export", "export_model"),
       ppdet=("--output_dir",)),
    _f(("--nosave",), "nosave", "save nothing but the final result", ("train", "detect"), action="store_true"),
    _f(("--noplots",), "noplots", "draw no pictures", ("train", "eval"), action="store_true"),
    _f(("--save-txt",), "save_txt", "write labels/<image stem>.txt: class xc yc w h, normalised (YOLO format)",
       ("eval", "detect"), action="store_true"),
    _f(("--save-conf",), "save_conf", "add each box's confidence to the --save-txt lines", ("eval", "detect"),
       action="store_true"),
    # --- training and evaluation ---
    _f(("--epochs",), "epochs", "number of epochs (overrides the config's epoch)", ("train", "demo"), type=int),
    _f(("--single-cls",), "single_cls", "the data's classes as one class", ("train", "eval"), action="store_true"),
    _f(("--multi-scale",), "multi_scale", "random training image sizes", ("train", "bench"), action="store_true"),
    _f(("--storage",), "storage", "Optuna storage of the evolution's population", ("train", "evolve"),
       metavar="URL"),
    _f(("--conf-thres",), "conf_thres", "confidence threshold", ("eval", "detect"), type=float),
    _f(("--iou-thres",), "iou_thres", "NMS IoU threshold", ("eval", "detect"), type=float),
    _f(("--max-det",), "max_det", "maximum detections per image", ("eval", "detect"), type=int),
    # `ppmulti yolo val` and `predict`'s translation of ultralytics' nms= (out of --help: the docs site is at its word
    # budget). --end2end: YOLO26's head, true the one-to-one branch without NMS (its config's default), false the
    # one-to-many branch through NMS (ultralytics' val and predict default, nms=None); other models have one head,
    # an ONNX file the head it was exported with.
    _f(("--end2end",), "end2end", argparse.SUPPRESS, ("eval", "detect"), choices=("true", "false")),
    # --rect: rectangular batches, images in aspect-ratio order, each batch letterboxed to its own shape; train's
    # help is its own (YOLOv5's); in eval ultralytics' val letterbox (YOLOv8/11/26 with --data, centred, half a
    # stride of margin), a warning where model or data cannot have it
    _f(("--rect",), "rect", argparse.SUPPRESS, ("train", "eval"), action="store_true"),
    # --- consoles and servers ---
    _f(("--verbose",), "verbose", "print more", ("eval", "demo", "launch"), action="store_true"),
    _f(("--host",), "host", "address to listen on", ("board", "evolve", "launch")),
    _f(("--port",), "port", "port to serve on", ("board", "evolve"), type=int),
)

# One spelling, two different flags (values of another kind), each kept in its tool; a new one is added here with why.
HOMONYMS = {
    "--format": "export's model format (paddle, onnx) and `ppmulti data demo`'s annotation format (coco, yolo, both)",
    "--gpus": "launch's GPU ids (fleetrun's, 0,1,2,3) and bench --predict's GPUs per node (a count)",
    "--nodes": "launch's hosts to start over ssh and bench --predict's number of nodes",
    "--heartbeat": "evolve's heartbeat period in seconds and bench's on/off comparison of the watchdog's reports",
    "--amp": "train's mixed precision and eval's refusal of PaddleDetection's eval.py --amp (ppdet_flags)",
}

BY_DEST: dict[str, Flag] = {f.dest: f for f in FLAGS}
BY_NAME: dict[str, Flag] = {name: f for f in FLAGS for name in f.spellings}
assert len(BY_DEST) == len(FLAGS) and len(BY_NAME) == sum(len(f.spellings) for f in FLAGS)

_UNSET = object()


def add(p, dest: str, help: str | None = None, default=_UNSET, metavar: str | None = None,
        required: bool | None = None) -> argparse.Action:
    """Add table flag ``dest`` to parser or group ``p``, with the tool's own help text or default where its meaning
    differs (the spellings, dest and type are the table's)."""
    value: dict = {} if default is _UNSET else {"default": default}
    if metavar is not None:
        value["metavar"] = metavar
    if required is not None:
        value["required"] = required
    return BY_DEST[dest].add_to(p, help, **value)


def names(dest: str) -> tuple[str, ...]:
    """Every spelling of table flag ``dest`` (for a table-driven parser such as launch's)."""
    return BY_DEST[dest].spellings


def overrides(args: argparse.Namespace) -> list[str]:
    """The -o values, flattened (each -o may carry several key=value items)."""
    return [item for group in (getattr(args, "opt", None) or []) for item in group]


def parse_overrides(items: Iterable[str]) -> dict[str, Any]:
    """Turn ``["a.b=1", "c=[1, 2]"]`` into a nested dict; values are parsed as YAML."""
    result: dict[str, Any] = {}
    for item in items or []:
        if "=" not in item:
            raise UserError(f"-o {item!r}: expected key=value, e.g. -o epoch=10 or -o TrainReader.batch_size=4")
        dotted, raw = item.split("=", 1)
        dotted = dotted.strip()
        if not dotted or any(not part for part in dotted.split(".")):
            raise UserError(f"-o {item!r}: empty key; expected key=value, e.g. -o LearningRate.base_lr=0.01")
        try:
            value = yaml.safe_load(raw) if raw.strip() != "" else ""
        except yaml.YAMLError:
            value = raw
        node = result
        parts = dotted.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise UserError(f"-o {item!r}: {part} is given both as a value and as a section")
        node[parts[-1]] = value
    return result
