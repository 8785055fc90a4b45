"""ultralytics' command line (`yolo detect train key=value ...`): every key of its cfg/default.yaml (8.4, and
8.3's half/int8/keras), what each becomes here (a flag of ppmulti's train/val/detect/export tools, a hyperparameter,
or a refusal by name), and the pure mapping from such a command line to the tool's argv."""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from ppmulti.common.errors import UserError

TASKS = ("detect", "segment", "semantic", "depth", "classify", "pose", "obb")
MODES = ("train", "val", "predict", "export", "track", "benchmark")
MODE_TOOLS = {"train": "train", "val": "eval", "predict": "detect", "export": "export"}
# ultralytics' run directories: runs/detect/train, train2, ...; val, predict and export likewise
DEFAULT_PROJECT = "runs/detect"

# The hyperparameters that go to the run's hyp file (ppmulti.common.hyp's keys, read by the model's recipe).
HYP_KEYS = ("lr0", "lrf", "momentum", "weight_decay", "warmup_epochs", "warmup_momentum", "warmup_bias_lr", "box",
            "cls", "dfl", "hsv_h", "hsv_s", "hsv_v", "degrees", "translate", "scale", "shear", "perspective",
            "flipud", "fliplr", "mosaic", "mixup", "copy_paste")

Value = Any
Emit = Callable[[Value, dict], list]   # (value, every key's value) -> argv items


@dataclass(frozen=True)
class Key:
    """One key of ultralytics' default.yaml: its default, and what a value becomes in each mode."""
    default: Value
    to: dict[str, Emit] = field(default_factory=dict)   # mode -> argv for a value that is not the default
    neutral: tuple = ()          # values besides the default that change nothing here (accepted, no flag)
    refuse: str = ""             # why another value cannot be honoured (said in the refusal)
    any_value: str = ""          # accepted with any value: why it changes nothing in detection (as in ultralytics)


def _flag(name: str) -> Emit:
    return lambda v, _: [name, _text(v)]


def _switch(name: str, when: bool = True) -> Emit:
    return lambda v, _: [name] if bool(v) is when else []


def _text(v: Value) -> str:
    if isinstance(v, (list, tuple)):
        return ",".join(str(x) for x in v)
    return str(v)


def _seq(name: str) -> Emit:
    return lambda v, _: [name, *[str(x) for x in (v if isinstance(v, (list, tuple)) else [v])]]


def _all(modes: tuple[str, ...], emit: Emit) -> dict[str, Emit]:
    return {m: emit for m in modes}


TRAIN, VAL, PREDICT, EXPORT = ("train",), ("val",), ("predict",), ("export",)
_RUNS = ("train", "val", "predict")


def _batch(v: Value, keys: dict) -> list:
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise UserError(f"batch={v}: give the global batch as a whole number, e.g. batch=64 (AutoBatch, batch=-1 "
                        f"or a memory fraction, is not implemented: ppmulti splits the global batch across ranks)")
    return ["--batch", str(v)]


def _cache(v: Value, keys: dict) -> list:
    if v is True or v == "ram":
        return ["--cache", "ram"]
    if v == "disk":
        return ["--cache", "disk"]
    if v in (False, None):
        return []
    raise UserError(f"cache={v}: expected True, ram, disk or False")


def _amp(v: Value, keys: dict) -> list:
    # ultralytics' AMP is float16 on CUDA only, as ppmulti's default; bf16 asks for it on CPUs as well
    if v in (False, "fp32"):
        return ["--no-amp"]
    if v in (True, "fp16"):
        return []
    if v == "bf16":
        return ["--amp"]
    raise UserError(f"amp={v}: expected True, False, fp16, bf16 or fp32")


def _optimizer(v: Value, keys: dict) -> list:
    if v in ("SGD", "MuSGD", "Adam", "AdamW"):
        return ["--optimizer", v]
    if v == "auto":
        return []
    raise UserError(f"optimizer={v}: ppmulti trains with SGD, MuSGD, Adam, AdamW or auto (its model's recipe); "
                    f"Adamax, NAdam, RAdam and RMSProp are not implemented")


def _nbs(v: Value, keys: dict) -> list:
    batch = keys.get("batch", 16)
    if not isinstance(v, int) or isinstance(v, bool) or v < 1:
        raise UserError(f"nbs={v}: expected a whole number of images, e.g. nbs=64")
    return ["--accumulate", str(max(round(v / batch), 1))] if isinstance(batch, int) and batch > 0 else []


def _multi_scale(v: Value, keys: dict) -> list:
    if v in (0, 0.0, False):
        return []
    if v in (0.5, True):
        return ["--multi-scale"]
    raise UserError(f"multi_scale={v}: ppmulti's multi-scale draws sizes in [0.5, 1.5] x imgsz: give multi_scale=0.5 "
                    f"or 0")


def _resume(v: Value, keys: dict) -> list:
    if v is False or v is None:
        return []
    if isinstance(v, str):
        return ["--resume", v]
    model = keys.get("model")
    return ["--resume", model] if isinstance(model, str) and model.endswith((".pt", ".pdparams")) else ["--resume"]


def _pretrained(v: Value, keys: dict) -> list:
    if isinstance(v, str):
        return ["--weights", v]
    return []


def _format(v: Value, keys: dict) -> list:
    if v in ("onnx", "paddle"):
        return ["--include", v]
    raise UserError(f"format={v}: ppmulti exports onnx or paddle (a Paddle inference model); {v} is not "
                    f"implemented")


def _simplify(v: Value, keys: dict) -> list:
    # ultralytics slims every ONNX-based export unless simplify=False, and other formats ignore the key (an export
    # line always has a format; flag_keys' probes give none)
    return ["--simplify"] if v and keys.get("format", "onnx") == "onnx" else []


def _device(v: Value, keys: dict) -> list:
    if v is None or v == "":
        return []
    if v == -1 or v == "-1":
        raise UserError("device=-1 (pick idle GPUs) is not implemented: name the GPUs, e.g. device=0,1")
    return ["--device", _text(v).replace(" ", "").strip("[]")]


def _end2end(v: Value, keys: dict) -> list:
    return ["--end2end", "true" if v is False else "false"]


def training_val(keys: Mapping[str, Value]) -> tuple[bool, bool]:
    """How ultralytics 8.4's trainer evaluates after each epoch, from a train line's ``keys``: (rect, end2end).
    Its val loader is always built with rect batches (DetectionTrainer.build_dataset: ``rect=mode == "val"``, half
    a stride of pad), whatever ``rect`` says (that key asks for rect TRAINING batches); its validator sets the head
    by ``end2end = nms is False`` (YOLO26: one-to-many through NMS unless nms=False)."""
    return True, keys.get("nms") is False


def _split(v: Value, keys: dict) -> list:
    if v == "val":
        return []
    raise UserError(f"split={v}: ppmulti validates the data's val split; point data= at a yaml whose val is the "
                    f"{v} images")


_FIXED = "not implemented in ppmulti"
KEYS: dict[str, Key] = {
    "task": Key("detect"),
    "mode": Key("train"),
    # --- train ---
    "model": Key(None),
    "data": Key(None, _all((*TRAIN, *VAL), _flag("--data"))),
    "epochs": Key(100, _all(TRAIN, _flag("--epochs"))),
    "time": Key(None, refuse="a time limit in hours: " + _FIXED + "; give epochs="),
    "patience": Key(100, _all(TRAIN, _flag("--patience"))),
    "batch": Key(16, {"train": _batch, "val": _batch}),
    "imgsz": Key(640, _all((*TRAIN, *VAL, *PREDICT, *EXPORT), _seq("--img"))),   # [h, w]: --img H W
    "save": Key(True, {"train": _switch("--nosave", False), "predict": _switch("--nosave", False)}),
    "save_period": Key(-1, _all(TRAIN, _flag("--save-period"))),
    "cache": Key(False, {"train": _cache}),
    "device": Key(None, _all((*TRAIN, *VAL, *PREDICT, *EXPORT), _device)),
    "workers": Key(8, _all((*TRAIN, *VAL), _flag("--workers"))),
    "project": Key(None, _all(_RUNS, _flag("--project"))),
    "name": Key(None, _all(_RUNS, _flag("--name"))),
    "exist_ok": Key(False, _all(_RUNS, _switch("--exist-ok"))),
    "pretrained": Key(True, {"train": _pretrained}, neutral=(False,)),
    "cls_remap": Key(True, refuse="remapping a pretrained head's class rows by name: " + _FIXED),
    "optimizer": Key("auto", {"train": _optimizer}),
    "verbose": Key(True, any_value="the console is the same either way"),
    "seed": Key(0, _all(TRAIN, _flag("--seed"))),
    "deterministic": Key(True, {"train": lambda v, _: ["--deterministic" if v else "--no-deterministic"]}),
    "single_cls": Key(False, _all((*TRAIN, *VAL), _switch("--single-cls"))),
    # val: ultralytics' model.val() letterboxes rect batches (rect=True); ppmulti's tool where model and data allow
    "rect": Key(False, {"train": _switch("--rect"), "val": lambda v, _: ["--rect"] if v else []}),
    "cos_lr": Key(False, _all(TRAIN, _switch("--cos-lr"))),
    "close_mosaic": Key(10, {"train": lambda v, _: ["-o", f"close_mosaic={int(v)}"]}),
    "resume": Key(False, {"train": _resume}),
    "amp": Key(True, {"train": _amp}),
    "fraction": Key(1.0, refuse="training on part of the set: " + _FIXED + "; point data= at a smaller list"),
    "profile": Key(False, refuse="ONNX/TensorRT speed profiling during training: " + _FIXED),
    "freeze": Key(None, _all(TRAIN, _seq("--freeze"))),
    "multi_scale": Key(0.0, {"train": _multi_scale}),
    "compile": Key(False, refuse="torch.compile has no Paddle counterpart here"),
    "channels_last": Key(None, neutral=(False,), refuse="a torch memory layout; Paddle keeps NCHW"),
    "overlap_mask": Key(True, any_value="a segmentation key; detection has no masks"),
    "mask_ratio": Key(4, any_value="a segmentation key; detection has no masks"),
    "dropout": Key(0.0, any_value="a classification key; detection heads have no dropout"),
    # --- val ---
    "val": Key(True, {"train": _switch("--noval", False)}),
    "split": Key("val", {"val": _split}),
    "save_json": Key(False, {"val": _switch("--save-json")}, refuse="in train mode: run val with save_json=True"),
    "conf": Key(None, _all((*VAL, *PREDICT), _flag("--conf-thres"))),
    "iou": Key(0.7, _all((*VAL, *PREDICT), _flag("--iou-thres"))),
    "max_det": Key(300, _all((*VAL, *PREDICT), _flag("--max-det"))),
    "quantize": Key(None, {"export": lambda v, _: ["--half"] if str(v) in ("16", "fp16") else []},
                    neutral=(32, "32", "fp32"), refuse="INT8 quantization: " + _FIXED),
    "half": Key(False, _all(EXPORT, _switch("--half"))),
    "dnn": Key(False, refuse="OpenCV DNN inference: " + _FIXED),
    "plots": Key(True, _all((*TRAIN, *VAL), _switch("--noplots", False))),
    # val and predict: ultralytics 8.4 sets the head by `end2end = nms is False` (its validator, and its predictor's
    # AutoBackend), so nms=None (the default) and True read YOLO26's one-to-many head through NMS, nms=False its
    # one-to-one head; train: the evaluation after each epoch does the same (training_val, read into the run's plan)
    "nms": Key(None, {"export": lambda v, _: ["--nms"] if v else ["--no-nms"], "val": _end2end, "predict": _end2end,
                      "train": lambda v, _: []}),
    # --- predict ---
    "source": Key(None, _all(PREDICT, _flag("--source"))),
    "vid_stride": Key(1, _all(PREDICT, _flag("--vid-stride"))),
    "stream_buffer": Key(False, refuse="buffering every frame of a stream: " + _FIXED),
    "visualize": Key(False, refuse="feature-map pictures: " + _FIXED),
    "augment": Key(False, refuse="test-time augmentation: " + _FIXED),
    "agnostic_nms": Key(False, _all(PREDICT, _switch("--agnostic-nms"))),
    "classes": Key(None, _all(PREDICT, _seq("--classes"))),
    "retina_masks": Key(False, any_value="a segmentation key; detection has no masks"),
    "embed": Key(None, refuse="feature embeddings: " + _FIXED),
    "show": Key(False, refuse="a window on screen: " + _FIXED + "; results are saved under project/name"),
    "save_frames": Key(False, refuse="saving each video frame: " + _FIXED),
    "save_txt": Key(False, _all((*VAL, *PREDICT), _switch("--save-txt"))),
    "save_conf": Key(False, _all((*VAL, *PREDICT), _switch("--save-conf"))),
    "save_crop": Key(False, _all(PREDICT, _switch("--save-crop"))),
    "show_labels": Key(True, _all(PREDICT, _switch("--hide-labels", False))),
    "show_conf": Key(True, _all(PREDICT, _switch("--hide-conf", False))),
    "show_boxes": Key(True, refuse="pictures without boxes: " + _FIXED),
    "line_width": Key(None, _all(PREDICT, _flag("--line-thickness"))),
    # --- export ---
    "format": Key("torchscript", {"export": _format}),
    "keras": Key(False, refuse="TensorFlow: " + _FIXED),
    "optimize": Key(False, refuse="a DEEPX compiler setting: " + _FIXED),
    "int8": Key(False, refuse="INT8 quantization: " + _FIXED),
    "dynamic": Key(False, _all(EXPORT, _switch("--dynamic"))),
    "simplify": Key(True, _all(EXPORT, _simplify)),
    "opset": Key(None, _all(EXPORT, _flag("--opset"))),
    "workspace": Key(None, refuse="a TensorRT setting: " + _FIXED),
    # --- hyperparameters: the run's hyp file (see yolo_args) ---
    "lr0": Key(0.01), "lrf": Key(0.01), "momentum": Key(0.937), "weight_decay": Key(0.0005),
    "warmup_epochs": Key(3.0), "warmup_momentum": Key(0.8), "warmup_bias_lr": Key(0.1),
    "distill_model": Key(None, refuse="knowledge distillation: " + _FIXED),
    "dis": Key(6.0, any_value="the distillation gain; it matters only with distill_model"),
    "box": Key(7.5), "cls": Key(0.5),
    "cls_pw": Key(0.0, refuse="class weights by frequency: " + _FIXED),
    "dfl": Key(1.5),
    "pose": Key(12.0, any_value="a pose key"), "kobj": Key(1.0, any_value="a pose key"),
    "rle": Key(1.0, any_value="a pose key"), "angle": Key(1.0, any_value="an obb key"),
    "dlog": Key(1.0, any_value="a depth key"), "dgrad": Key(0.5, any_value="a depth key"),
    "dlam": Key(1.0, any_value="a depth key"),
    "nbs": Key(64, {"train": _nbs}),
    "hsv_h": Key(0.015), "hsv_s": Key(0.7), "hsv_v": Key(0.4), "degrees": Key(0.0), "translate": Key(0.1),
    "scale": Key(0.5), "shear": Key(0.0), "perspective": Key(0.0), "flipud": Key(0.0), "fliplr": Key(0.5),
    "bgr": Key(0.0, refuse="RGB/BGR channel swaps: " + _FIXED),
    "mosaic": Key(1.0), "mixup": Key(0.0),
    "cutmix": Key(0.0, refuse="CutMix: " + _FIXED),
    "copy_paste": Key(0.0),
    "copy_paste_mode": Key("flip", any_value="it matters only with copy_paste, which needs segments"),
    "auto_augment": Key("randaugment", any_value="a classification key"),
    "erasing": Key(0.4, any_value="a classification key"),
    "cfg": Key(None),
    "tracker": Key("tracktrack.yaml", any_value="a track-mode key (track mode is not implemented)"),
    # ppmulti's own: N ranks on this machine's CPUs with device=cpu (GPUs: device=0,1,... starts one rank each);
    # BatchNorm over the global batch on several ranks (YOLOv5's --sync-bn; ultralytics normalises per rank)
    "nproc": Key(None, _all(TRAIN, _flag("--nproc"))),
    "sync_bn": Key(False, _all(TRAIN, _switch("--sync-bn"))),
}
OWN_KEYS = ("nproc", "sync_bn")
# mode defaults ultralytics applies where default.yaml leaves None (conf) or that differ per mode, and default.yaml's
# own where the tool's default differs (tools/export.py slims only with --simplify, as YOLOv5's export.py)
MODE_DEFAULTS = {"train": {"batch": 16, "imgsz": 640},
                 "val": {"conf": 0.001, "iou": 0.7, "max_det": 300, "rect": True, "nms": None},
                 "predict": {"conf": 0.25, "iou": 0.7, "max_det": 300, "nms": None},
                 "export": {"simplify": True}}
HELP = "ppmulti yolo [TASK] MODE key=value ... (TASK: detect; MODE: train, val, predict, export)"


def parse_value(text: str) -> Value:
    """A command-line value as ultralytics reads it: None/True/False, numbers, [lists], else the string."""
    import yaml

    low = text.strip()
    if low.lower() in ("none", "null", ""):
        return None
    if low.lower() in ("true", "false"):
        return low.lower() == "true"
    try:
        value = yaml.safe_load(low)
    except yaml.YAMLError:
        return low
    return value if isinstance(value, (int, float, list)) else low


@dataclass(frozen=True)
class YoloCommand:
    """An ultralytics command line, resolved: which tool runs, its argv, and the hyperparameters given."""
    task: str
    mode: str
    tool: str                       # train, eval, detect or export (ppmulti's tools)
    argv: tuple[str, ...]
    hyp: dict = field(default_factory=dict)   # HYP_KEYS given on the line (train only): the run's --hyp file
    keys: dict = field(default_factory=dict)  # every key given, as parsed


def _unknown(key: str) -> UserError:
    close = difflib.get_close_matches(key, list(KEYS), n=1)
    hint = f"; did you mean {close[0]}?" if close else "; see ultralytics' cfg/default.yaml for the keys"
    return UserError(f"'{key}' is not a valid YOLO argument{hint}")


def split_line(argv: list[str]) -> tuple[str, str, dict[str, Value]]:
    """``[TASK] MODE key=value ...`` -> (task, mode, keys); anything else refused by name."""
    task, mode, keys = "detect", None, {}
    for item in argv:
        word = item.lstrip("-") if item.startswith("--") and "=" in item else item
        if "=" in word:
            key, _, text = word.partition("=")
            key = key.strip()
            if key not in KEYS:
                raise _unknown(key)
            keys[key] = parse_value(text)
        elif word in TASKS and mode is None:
            task = word
        elif word in MODES and mode is None:
            mode = word
        elif word in MODES or word in TASKS:
            raise UserError(f"'{word}' given twice or after the mode; usage: {HELP}")
        else:
            raise UserError(f"'{word}' is neither a task, a mode nor key=value; usage: {HELP}")
    task = keys.pop("task", task)
    mode = keys.pop("mode", mode)
    if mode is None:
        raise UserError(f"no mode given; usage: {HELP}")
    if task != "detect":
        raise UserError(f"task={task}: ppmulti trains detection models only (task=detect)")
    if mode not in MODE_TOOLS:
        raise UserError(f"mode={mode}: {mode} is not implemented; ppmulti's modes are train, val, predict, export")
    return task, mode, keys


def _model_argv(mode: str, model: Value, keys: dict) -> list[str]:
    if model is None:
        if mode == "train":
            raise UserError("model= is missing: a model yaml (model=yolo11n.yaml) to train from scratch, or weights "
                            "(model=yolo11n.pt, a run's weights/best.pdparams) to fine-tune")
        raise UserError(f"model= is missing: the weights to {mode} (a run's weights/best.pdparams, or a .pt)")
    model = str(model)
    if mode == "train" and model.endswith((".yaml", ".yml")):
        return ["--cfg", model, "--weights", ""]
    if mode == "train" and "." not in model.rsplit("/", 1)[-1]:
        return ["--cfg", model, "--weights", ""]   # a bare name, as --cfg yolov5n
    if model.endswith((".yaml", ".yml")):
        if mode == "export":   # the untrained model, as ultralytics exports a yaml: MODEL.onnx beside its name
            return ["--cfg", model]
        raise UserError(f"model={model}: a model yaml has no trained weights to {mode}; pass weights (a run's "
                        f"weights/best.pdparams, or a .pt)")
    return ["--weights", model]


def resolve_line(argv: list[str], defaults: dict[str, Value] | None = None) -> YoloCommand:
    """The ultralytics command line ``argv`` (and ``defaults``: a cfg= file's keys, the API's) -> the tool's argv.

    Every key given becomes the tool's flag for this mode, or is accepted where its value changes nothing here
    (its default, a value ultralytics also ignores in detection), or is refused by name with what to do instead:
    a value that cannot be honoured, or a key this mode does not use."""
    task, mode, given = split_line(argv)
    keys = {**(defaults or {}), **given}
    if mode == "export" and keys.get("format") is None:
        raise UserError("format= is missing: ppmulti exports format=onnx or format=paddle (ultralytics' default, "
                        "torchscript, is PyTorch's)")
    out = _model_argv(mode, keys.get("model"), keys)
    hyp = {}
    keys = {**{k: v for k, v in MODE_DEFAULTS.get(mode, {}).items() if k not in keys}, **keys}
    for name, value in keys.items():
        if name in ("model", "cfg"):
            continue
        spec = KEYS[name]
        _check_type(name, value)
        if name in HYP_KEYS:
            if mode == "train" and value is not None:
                hyp[name] = _number(name, value)
            continue
        emit = spec.to.get(mode)
        if emit is not None:
            out += emit(value, keys)
            continue
        if spec.any_value or value == spec.default or value in spec.neutral:
            continue
        if spec.refuse:
            raise UserError(f"{name}={value}: {spec.refuse}")
        if mode != "train" and name in ("epochs", "patience", "save_period", "seed", "rect", "cos_lr",
                                        "close_mosaic", "optimizer", "freeze", "deterministic", "amp", "nbs"):
            raise UserError(f"{name}={value} is a training key; mode={mode} does not use it")
        raise UserError(f"{name}={value} has no meaning in mode={mode}")
    if "project" not in keys and mode in _RUNS:
        out += ["--project", DEFAULT_PROJECT]
    if "name" not in keys and mode in _RUNS:
        out += ["--name", mode]
    return YoloCommand(task, mode, MODE_TOOLS[mode], tuple(out), hyp, keys)


def args_record(command: YoloCommand, save_dir: str) -> dict[str, Value]:
    """A run's ``args.yaml`` as ultralytics writes it: every key of its default.yaml with the value this run
    resolved (the line's and cfg='s keys, else the mode's default, else default.yaml's), ``name`` as numbered
    (train2) and ``save_dir``."""
    keys = {"task": command.task, "mode": command.mode}
    keys.update({name: spec.default for name, spec in KEYS.items() if name not in ("task", "mode", *OWN_KEYS)})
    keys.update(MODE_DEFAULTS.get(command.mode, {}))
    keys.update({k: v for k, v in command.keys.items() if k in KEYS})
    keys["name"] = save_dir.replace("\\", "/").rstrip("/").rsplit("/", 1)[-1]   # train2: the numbered one
    keys["save_dir"] = save_dir
    return keys


# Keys whose values ppmulti's tools read as numbers (their argparse types): checked here, so that a wrong type is
# refused in the line's dialect (conf=abc) instead of by a tool's parser (--conf-thres: invalid float value).
# ultralytics checks the same kinds (cfg/__init__.py: integer-only keys, fractions and floats).
_WHOLE_KEYS = ("epochs", "patience", "workers", "seed", "close_mosaic", "max_det", "vid_stride", "line_width",
               "save_period", "opset", "nproc")
_NUMBER_KEYS = ("conf", "iou")
# ultralytics 8.4's CFG_BOOL_KEYS that ppmulti knows, and its own sync_bn: a switch takes True or False only, as
# ultralytics' check_cfg asks (sync_bn=abc would otherwise switch it on); cache, resume, pretrained and compile
# also take a word, as there
_BOOL_KEYS = ("agnostic_nms", "augment", "cls_remap", "cos_lr", "deterministic", "dnn", "dynamic", "exist_ok", "nms",
              "optimize", "overlap_mask", "plots", "profile", "rect", "retina_masks", "save", "save_conf",
              "save_crop", "save_frames", "save_json", "save_txt", "show", "show_boxes", "show_conf", "show_labels",
              "simplify", "single_cls", "stream_buffer", "sync_bn", "val", "verbose", "visualize")
_EXAMPLES = {"conf": 0.25, "iou": 0.7, "line_width": 3, "opset": 17, "nproc": 2}


def _check_type(name: str, value: Value) -> None:
    """A value of the wrong kind for ``name`` (a word for a number, 2.5 epochs), refused by name."""
    if value is None:
        return
    example = _EXAMPLES.get(name, KEYS[name].default)
    whole = isinstance(value, int) and not isinstance(value, bool)
    if name in _WHOLE_KEYS and not whole:
        raise UserError(f"{name}={value}: expected a whole number, e.g. {name}={example}")
    if name in _NUMBER_KEYS and not (whole or isinstance(value, float)):
        raise UserError(f"{name}={value}: expected a number, e.g. {name}={example}")
    if name in _BOOL_KEYS and not isinstance(value, bool):
        raise UserError(f"{name}={value}: expected True or False, e.g. {name}=True")
    if name == "imgsz":
        sizes = value if isinstance(value, list) else [value]
        if not sizes or not all(isinstance(v, int) and not isinstance(v, bool) for v in sizes):
            raise UserError(f"imgsz={value}: expected a size in pixels, e.g. imgsz=640")


def _number(name: str, value: Value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise UserError(f"{name}={value}: expected a number, e.g. {name}={KEYS[name].default}")
    return float(value)


# ----------------------------------------------------------------------------- messages in ultralytics' dialect
# The flags' messages (checked by the train tool, ppmulti.rank.entry) name flags as `--epochs -1`; on an ultralytics
# line they are said back as the user typed them, `epochs=-1`. The table comes from KEYS' own emitters (what each
# key becomes), with the train parser's aliases of the same flag (--img, --img-size for --imgsz).
_MODEL_FLAGS = ("--cfg", "--weights")    # _model_argv: model= becomes one of these
_PROBES: tuple[Value, ...] = (True, False, 7, "v", "SGD", "disk", "onnx")
_PUNCT = ":;,.)"


@dataclass(frozen=True)
class FlagKey:
    """A tool flag said as an ultralytics key: ``key``, and for a switch the value it stands for."""
    key: str
    switch: Value = None     # None: the flag takes a value; else the key's value the bare flag means
    many: bool = False       # the flag takes several values (freeze=0,1,2 is --freeze 0 1 2)
    path_too: bool = False   # a switch that also takes a path (--resume, --resume runs/x)


def _emitted(emit: Emit, value: Value) -> list:
    try:
        return [str(x) for x in emit(value, {"batch": 16})]
    except (UserError, TypeError, ValueError):
        return []


def flag_keys(mode: str = "train") -> dict[str, FlagKey]:
    """``--flag`` -> the key (and switch value) it stands for in ``mode``'s tool, from KEYS' emitters: a flag
    whose value passes through unchanged, or a bare switch; flags carrying a computed value (nbs= becomes
    --accumulate N) are left out, since their value is not the user's. Train mode adds the train parser's aliases."""
    table: dict[str, FlagKey] = {flag: FlagKey("model") for flag in _MODEL_FLAGS}
    for name, spec in KEYS.items():
        emit = spec.to.get(mode)
        if emit is None or name in ("nbs", "close_mosaic", "amp", "quantize"):
            continue
        for probe in _PROBES:
            items = _emitted(emit, probe)
            if len(items) == 1 and items[0].startswith("--"):
                table.setdefault(items[0], FlagKey(name, probe, path_too=items + ["v"] == _emitted(emit, "v")))
            elif len(items) >= 2 and items[0].startswith("--") and items[1:] == [_text(probe)]:
                # several values (_seq): a list comes out as separate words, not one comma-joined word
                table.setdefault(items[0], FlagKey(name, many=len(_emitted(emit, [1, 2])) == 3))
    if mode == "train":
        _add_aliases(table)
    else:
        _add_shared_aliases(table)
    return table


def _add_aliases(table: dict[str, FlagKey]) -> None:
    import argparse

    from ppmulti.common.train_flags import build_parser

    for action in build_parser()._actions:
        known = [table[s] for s in action.option_strings if s in table]
        if not known:
            continue
        boolean = isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction))
        if action.nargs == 0 and not boolean:
            continue   # --deterministic/--no-deterministic: each already has its own entry
        for option in action.option_strings:
            if option.startswith("--"):
                table.setdefault(option, known[0])


def _add_shared_aliases(table: dict[str, FlagKey]) -> None:
    """The val, predict and export tools' other spellings of a flag (--imgsz and --img-size beside --img,
    --batch-size beside --batch, --conf_thres beside --conf-thres), from the flags' shared table."""
    from ppmulti.common.flags import BY_NAME, twins

    for flag in list(table):
        for spelling in BY_NAME[flag].spellings if flag in BY_NAME else twins((flag,)):
            if spelling.startswith("--"):
                table.setdefault(spelling, table[flag])


def dialect_environ(command: YoloCommand) -> dict[str, str]:
    """The variable that has the tool `ppmulti yolo` execs (val, predict, export) say its errors in the line's
    dialect (``errors.as_typed``): the mode and the keys as the user gave them."""
    import json

    from ppmulti.common.envvars import PPMULTI_ULTRA_DIALECT

    return {PPMULTI_ULTRA_DIALECT: json.dumps({"mode": command.mode, "given": command.keys}, default=str)}


def as_typed(message: str, environ: Mapping[str, str] | None = None) -> str:
    """``message`` in the dialect of the line that started this process: in a tool that `ppmulti yolo val|predict|
    export` execs (PPMULTI_ULTRA_DIALECT set), the keys typed (``conf=2``) where the tool names its flags
    (``--conf-thres 2``); elsewhere as written."""
    import os

    from ppmulti.common.envvars import PPMULTI_ULTRA_DIALECT

    text = (os.environ if environ is None else environ).get(PPMULTI_ULTRA_DIALECT)
    return dialect_of_environ(message, text) if text else message


def dialect_of_environ(message: str, text: str) -> str:
    """``message`` said in the dialect ``text`` (the PPMULTI_ULTRA_DIALECT value ``dialect_environ`` wrote)
    describes; unchanged when ``text`` is not that JSON (a message is never lost to a bad variable)."""
    import json

    try:
        spec = json.loads(text)
        mode, given = str(spec["mode"]), dict(spec.get("given") or {})
    except (ValueError, TypeError, KeyError):
        return message
    if mode not in MODE_TOOLS:
        return message
    return ultra_dialect(message, mode, given)


def ultra_dialect(message: str, mode: str = "train", given: dict[str, Value] | None = None,
                  table: dict[str, FlagKey] | None = None) -> str:
    """A tool's message with its flags said as ultralytics keys: ``--epochs -1: ...`` -> ``epochs=-1: ...``,
    ``--freeze 1 2`` -> ``freeze=1,2``, ``--noval`` -> ``val=False``. Flags no key stands for stay as they are.
    The word after a flag is its value when it looks like one (a number, a path, a list) or is the value the
    user gave (``given``: the line's keys); otherwise the flag is named in prose (``pass --data with`` -> ``pass
    data= with``)."""
    table = flag_keys(mode) if table is None else table
    given = given or {}
    words = message.split(" ")
    out: list[str] = []
    i = 0
    while i < len(words):
        word = words[i]
        flag, eq, inline = word.partition("=")
        bare = flag.rstrip(_PUNCT)
        entry = table.get(bare) if bare.startswith("--") else None
        if entry is None:
            out.append(word)
            i += 1
            continue
        following = words[i + 1] if i + 1 < len(words) else ""
        if entry.path_too and flag == word and ("/" in following or "." in following.rstrip(_PUNCT)):
            entry = FlagKey(entry.key)   # --resume runs/train/exp: the path is the value
        if entry.switch is not None:
            out.append(f"{entry.key}={entry.switch}{flag[len(bare):]}")
            i += 1
            continue
        if eq:   # --data=x
            value, tail = _split_tail(inline)
            out.append(f"{entry.key}={value}{tail}")
            i += 1
            continue
        if bare != flag:   # punctuation right after the flag: no value follows it here
            out.append(f"{entry.key}={flag[len(bare):]}")
            i += 1
            continue
        values, tail, i = [], "", i + 1
        if i < len(words) and not _value_like(words[i], given.get(entry.key), KEYS[entry.key].to.get(mode)
                                              if entry.key in KEYS else None):
            out.append(f"{entry.key}=")
            continue
        while i < len(words) and words[i] and not words[i].startswith("--"):
            value, tail = _split_tail(words[i])
            if values and not _is_number(value):
                break
            values.append(value)
            i += 1
            if tail or not entry.many:
                break
        out.append(f"{entry.key}={','.join(values)}{tail}")
    return " ".join(out)


def _value_like(word: str, given: Value, emit: Emit | None = None) -> bool:
    """Whether ``word`` (after a flag in a message) is the flag's value rather than the sentence going on: the
    value given, one that looks like a value, or one of the key's own closed set (format=onnx, as ``emit`` takes
    it while refusing any word)."""
    value, _ = _split_tail(word)
    if not value or value.startswith("--"):
        return False
    if given is not None and value == _text(given):
        return True
    if emit is not None and _emitted(emit, value) and not _emitted(emit, "\x00 not a value"):
        return True
    return _is_number(value) or any(c in value for c in "/.,\\=[") or value in ("True", "False", "None")


def _split_tail(word: str) -> tuple[str, str]:
    """``missing.yaml:`` -> (``missing.yaml``, ``:``): the punctuation that ends a value in a sentence."""
    value = word.rstrip(_PUNCT) or word.rstrip(_PUNCT.replace(".", ""))   # "." alone is a path: "--source .:"
    return value, word[len(value):]


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True
