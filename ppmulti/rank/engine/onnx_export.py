"""ONNX export: the inference model converted by paddle2onnx, NMS in or out of the graph, fixed or dynamic batch,
simplified by onnxslim (--simplify), in float16 (--half), and carrying the config it was exported with (its model
card: what predicting on the file alone needs)."""

from __future__ import annotations

import logging
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

from ppmulti.rank import compat
from ppmulti.common.atomic import atomic_path
from ppmulti.common.errors import UserError

log = logging.getLogger("ppmulti")

INSTALL = 'pip install -e ".[export]"'
P2O_PYTHON_LIMIT = (3, 13)   # the first Python without a paddle2onnx wheel (setup.py's export extra says the same)
ONNX_FILE = "model.onnx"
SLIM_INSTALL = "pip install onnxslim"
# model dir, opset, architecture, paddle2onnx version -> the ONNX bytes
Converter = Callable[[Path, int, str, str], bytes]   # YOLOv5's simplifier; pure Python (onnx, sympy, ml_dtypes)
# The ONNX file's metadata (ModelProto.metadata_props), read back by tools/detect.py when no -c is given, so that a
# file exported from an ultralytics .pt, or copied away from its run, predicts as ultralytics' ONNX files do.
META_CONFIG = "ppmulti_config"   # the resolved config (YAML) the model was exported with, data sets left out
META_NAMES = "names"             # the class names, a JSON list in class order
# the data sets' sections hold paths of the machine that exported (the names travel apart, in META_NAMES)
UNSTORED = ("TrainDataset", "EvalDataset", "TestDataset")


@dataclass(frozen=True)
class OnnxOptions:
    """What the ONNX graph holds. ``nms``: ppdet's multiclass NMS as ONNX NonMaxSuppression (outputs: detections
    [N, 6] class, score, x1, y1, x2, y2 and their count per image [B]); without it, the decoded boxes [B, N, 4]
    and scores [B, C, N]. ``dynamic``: a symbolic batch dimension, else ``batch`` images exactly. ``simplify``:
    the graph slimmed by onnxslim (constants folded, shape arithmetic removed). ``half``: float16 weights and
    arithmetic, float32 inputs and outputs (``to_half``)."""

    nms: bool = True
    dynamic: bool = False
    batch: int = 1
    opset: int = 11
    simplify: bool = False
    half: bool = False

    def check(self) -> None:
        if self.batch < 1:
            raise UserError(f"--batch-size {self.batch}: give 1 or more images per batch")
        if self.nms and (self.dynamic or self.batch != 1):
            what = "--dynamic" if self.dynamic else f"--batch-size {self.batch}"
            raise UserError(f"{what} with NMS in the graph: paddle2onnx's NonMaxSuppression export handles one "
                            f"image per run; add --no-nms (boxes and scores out, NMS yours) or export batch 1")
        if not 11 <= self.opset <= 17:
            raise UserError(f"--opset {self.opset}: use 11 to 17 "
                            f"(NonMaxSuppression needs 10+, paddle2onnx stops at 17)")


def require_paddle2onnx() -> str:
    """The installed paddle2onnx's version, or one line saying how to install the one this Paddle needs."""
    try:
        import onnx  # noqa: F401  (fix_batch edits the converted model with it)
        import paddle2onnx
    except ImportError:
        if sys.version_info >= P2O_PYTHON_LIMIT:
            raise UserError(f"--format onnx needs paddle2onnx, which has no release for Python "
                            f"{sys.version_info[0]}.{sys.version_info[1]} (2.1.0 stops at 3.12): export from a Python "
                            f"3.10-3.12 environment with {INSTALL}") from None
        raise UserError(f"--format onnx needs paddle2onnx and onnx (onnxruntime to run the result): "
                        f"{INSTALL}") from None
    text = str(getattr(paddle2onnx, "__version__", "0"))
    version = tuple(int(p) for p in text.split(".")[:3] if p.isdigit())
    if not compat.paddle2onnx_fits(version):
        raise UserError(f"paddle2onnx {text} does not read this Paddle's exported programs: "
                        f"pip install \"{compat.paddle2onnx_wanted()}\" (or {INSTALL})")
    return text


def require_onnxslim() -> None:
    """onnxslim importable, or one line saying how to install it."""
    try:
        import onnxslim  # noqa: F401
    except ImportError:
        raise UserError(f"--simplify needs onnxslim (the simplifier YOLOv5 uses): {SLIM_INSTALL}") from None


def require_float16() -> None:
    """onnxruntime's float16 converter importable, or one line saying how to install it."""
    try:
        from onnxruntime.transformers import float16  # noqa: F401
    except ImportError:
        raise UserError(f"--half needs onnxruntime (its float16 converter): {INSTALL}") from None


def simplify(data: bytes) -> bytes:
    """The ONNX model slimmed by onnxslim, as YOLOv5's --simplify does: constant subgraphs folded, shape
    arithmetic and identities dropped; the outputs stay the same numbers (a YOLOv5n graph goes from 1135 nodes
    to 269 with paddle2onnx 2.1.0, from 796 with 1.3.1)."""
    import onnx
    import onnxslim

    return onnxslim.slim(onnx.load_from_string(data)).SerializeToString()


def to_half(data: bytes) -> bytes:
    """The ONNX model with float16 weights and arithmetic, by onnxruntime's float16 converter (onnxconverter-common's
    converter, as onnxruntime maintains it: onnxconverter-common 1.16.0 writes a graph that onnxruntime refuses
    for paddle2onnx 2.1.0's output, a Cast whose type disagrees with its declared output). Inputs and outputs stay
    float32 (``keep_io_types``: casts at the edges), so the same preprocessing feeds both models; ops without
    float16 kernels (NonMaxSuppression, TopK, Range ...) stay float32 behind casts. The tensor shapes the converter
    infers are dropped again: onnxruntime infers its own, and refuses those of paddle2onnx 1.3.1's NMS subgraph
    ("Gather ... data tensor must have rank >= 1")."""
    import onnx
    from onnxruntime.transformers import float16

    model = onnx.load_from_string(data)
    with warnings.catch_warnings():   # "the float32 number 9.9e-08 will be truncated to 1e-07", once per constant
        warnings.filterwarnings("ignore", message=".*will be truncated to")
        model = float16.convert_float_to_float16(model, keep_io_types=True)
    del model.graph.value_info[:]
    return model.SerializeToString()


def check_loads(data: bytes, what: str) -> None:
    """onnxruntime (CPU) builds a session from the model, else a RuntimeError naming the step that broke it."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.log_severity_level = 3   # not its warnings about paddle2onnx's unused constants, one line each
    try:
        onnxruntime.InferenceSession(data, options, providers=["CPUExecutionProvider"])
    except Exception as exc:   # noqa: BLE001 - onnxruntime raises its own types for invalid graphs
        raise RuntimeError(f"{what}: onnxruntime cannot load the result: {str(exc).splitlines()[0]}") from exc


class ExportFailed(UserError):
    """The tools could not do the job (not the user's input): exit code 1."""

    exit_code = 1


def check_converted(data: bytes, architecture: str, model_dir: Path, version: str) -> None:
    """One line, and no ONNX file, where onnxruntime cannot load what paddle2onnx wrote (RetinaNet's graph on
    Paddle 3.3.1 + paddle2onnx 2.1.0: "Node input 'p2o.sub_block.pd_op.array_write_...' is not a graph input",
    measured 2026-12-02); skipped where onnxruntime is not installed."""
    try:
        import onnxruntime  # noqa: F401
    except ImportError:
        return
    try:
        check_loads(data, f"paddle2onnx {version}")
    except RuntimeError as exc:
        why = str(exc).split("cannot load the result: ", 1)[-1][:200]
        raise ExportFailed(f"ONNX export of {architecture} ({model_dir.name}): onnxruntime cannot load what "
                           f"paddle2onnx {version} converted ({why}), so no ONNX file was written; use the Paddle "
                           f"inference model written to {model_dir} (Paddle Inference, PaddleDetection's "
                           f"deploy/python/infer.py)") from None


def fix_batch(data: bytes, batch: int) -> bytes:
    """The ONNX model with the batch dimension of every input set to ``batch`` (ppdet exports it symbolic).
    Only the declared input shapes change, so onnxruntime refuses another batch; the graph stays as converted
    (paddle2onnx's own shape optimizer breaks the NMS subgraph: "Gather ... data tensor must have rank >= 1")."""
    import onnx

    model = onnx.load_from_string(data)
    for graph_input in model.graph.input:
        dims = graph_input.type.tensor_type.shape.dim
        if dims:
            dims[0].Clear()
            dims[0].dim_value = batch
    return model.SerializeToString()


def model_card(config: Mapping[str, Any], names: list[str]) -> dict[str, str]:
    """The metadata an exported file carries: the resolved ``config`` (plain data, ``config.resolved``) without its
    data sets, and the class ``names``."""
    import json

    import yaml

    kept = {k: v for k, v in config.items() if k not in UNSTORED}
    return {META_CONFIG: yaml.safe_dump(kept, sort_keys=False, default_flow_style=None),
            META_NAMES: json.dumps(list(names))}


def with_metadata(data: bytes, meta: Mapping[str, str]) -> bytes:
    """The ONNX model with ``meta`` in its metadata_props (a key already there takes the new value)."""
    import onnx

    model = onnx.load_from_string(data)
    props = {p.key: p.value for p in model.metadata_props}
    props.update(meta)
    del model.metadata_props[:]
    for key, value in props.items():
        model.metadata_props.add(key=key, value=value)
    return model.SerializeToString()


def read_metadata(onnx_file: Path) -> dict[str, str]:
    """An ONNX file's metadata_props, by onnx where installed (its protobuf is parsed, nothing run), else by
    onnxruntime (Python 3.13 has no onnx wheel); {} where neither is installed or the file is not ONNX (the caller
    then looks elsewhere, and onnxruntime says what is wrong with the file when it loads it)."""
    try:
        import onnx

        return {p.key: p.value for p in onnx.load(str(onnx_file), load_external_data=False).metadata_props}
    except ImportError:
        pass
    except Exception:   # noqa: BLE001 - onnx raises protobuf's DecodeError and others for a file that is not ONNX
        return {}
    try:
        import onnxruntime

        session = onnxruntime.InferenceSession(str(onnx_file), providers=["CPUExecutionProvider"])
        return dict(session.get_modelmeta().custom_metadata_map)
    except Exception:   # noqa: BLE001 - ImportError, or onnxruntime's own types for an unreadable file
        return {}


def card_config(meta: Mapping[str, str]) -> tuple[dict[str, Any], list[str]] | None:
    """(config without data sets, class names) from a file's metadata, None where it carries no model card (an
    ONNX file ppmulti did not write, or wrote before it kept one) or one that does not parse."""
    import json

    import yaml

    if META_CONFIG not in meta:
        return None
    try:
        config = yaml.safe_load(meta[META_CONFIG])
        names = json.loads(meta.get(META_NAMES, "[]"))
    except (yaml.YAMLError, json.JSONDecodeError):
        return None
    if not isinstance(config, dict) or not isinstance(names, list):
        return None
    return config, [str(n) for n in names]


def export_onnx(config: str, overrides: list[str], weights: str | None, output_dir: str,
                opts: OnnxOptions = OnnxOptions(), edit: Callable[[Any], None] | None = None,
                dst: Path | None = None, convert: Converter | None = None) -> Path:
    """Export the Paddle inference model (kept beside, as ppdet writes it, in ``output_dir/<config name>``),
    convert it to ONNX and write that to ``dst`` (default: ``model.onnx`` beside the Paddle model); returns the
    ONNX file's path, its metadata holding the config and class names (``model_card``). ``edit`` changes the
    loaded config first (YOLOv5's --imgsz, the run's model). ``convert``
    does the conversion (model dir, opset, architecture, paddle2onnx version -> ONNX bytes); the export tools pass
    ppmulti/procs/onnx_convert.py's, which runs it in a child process because paddle2onnx may crash the process
    (SIGABRT/SIGSEGV on PP-YOLO, SSD, TOOD, the R-CNNs); the default converts here."""
    from ppmulti.rank import config as config_mod
    from ppmulti.rank.engine import inference
    from ppmulti.rank.engine.detect import class_names

    opts.check()
    version = require_paddle2onnx()
    if opts.simplify:
        require_onnxslim()
    if opts.half:
        require_float16()
    cfg, model = inference.build_model(config, overrides, weights, edit)
    # the card's config now: ppdet's exporter puts the built model into cfg (a Layer, whose attributes refer
    # back to each other: Paddle 2.6's would recurse without end in to_plain)
    card_cfg = config_mod.resolved(cfg)
    if not opts.nms:
        inference.leave_nms_out(model)
    model_dir = inference.export_model(cfg, model, output_dir)
    if convert is None:
        data = compat.paddle_to_onnx(model_dir, opts.opset)
    else:
        data = convert(model_dir, opts.opset, str(cfg.get("architecture")), version)
    dst = Path(dst) if dst is not None else model_dir / ONNX_FILE
    if not opts.dynamic:
        data = fix_batch(data, opts.batch)
    check_converted(data, str(cfg.get("architecture")), model_dir, version)
    if opts.simplify:
        data = simplify(data)
        check_loads(data, "--simplify (onnxslim)")
    if opts.half:
        data = to_half(data)
        check_loads(data, "--half (float16 conversion)")
    try:
        names = class_names(cfg)
    except ValueError:   # ppdet's get_categories knows no categories for this metric: the card without names
        names = {}
    data = with_metadata(data, model_card(card_cfg, [names[i] for i in sorted(names)]))
    with atomic_path(dst) as tmp:
        Path(tmp).write_bytes(data)
    log.info("paddle2onnx %s: %s (opset %d, NMS %s, batch %s%s%s)", version, dst, opts.opset,
             "in the graph" if opts.nms else "left out", "dynamic" if opts.dynamic else opts.batch,
             ", simplified" if opts.simplify else "", ", float16" if opts.half else "")
    return dst
