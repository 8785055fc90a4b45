"""oneDNN convolutions for CPU training: the op built once, swapped (float32 or bf16) into a model's Conv2D layers."""

from __future__ import annotations

import contextlib
import hashlib
import io
import logging
import os
import sys
import types
from pathlib import Path

from ppmulti.rank import compat
from ppmulti.common.envvars import PPMULTI_CPU_CONV
from ppmulti.common.errors import UserError, first_line

log = logging.getLogger("ppmulti")

OP_NAME = "ppmulti_onednn_conv2d"
BF16_OP_NAME = "ppmulti_onednn_conv2d_bf16"         # bf16 inputs/weights, float32 accumulation and results
BIAS = "_bias"                                      # the op with a bias input: OP_NAME + BIAS, BF16_OP_NAME + BIAS
BF16_SUPPORT_OP_NAME = "ppmulti_onednn_bf16_support"
LIBRARY_NAME = "ppmulti_onednn_conv"
SOURCE = Path(__file__).with_name("onednn_conv.cc")
HEADERS_DIST = "onednn-devel-cpu-gomp"   # oneDNN 3.2's headers; Paddle 2.6.2 ships libdnnl 3.2.1 without them
CHOICES = ("onednn", "paddle")

_op = None            # the registered op's caller, once loaded
_bf16_op = None       # the bf16 variant's caller, once loaded
_failure = None       # why it could not be loaded, once tried
_registered = False   # the op is known to Paddle in this process (compiling it here also registers it)


class OpUnavailable(RuntimeError):
    """The oneDNN op cannot be built or loaded here; the message says why."""


def choice() -> str:
    """Which CPU convolution the user asked for: PPMULTI_CPU_CONV=onednn (default) or paddle."""
    value = os.environ.get(PPMULTI_CPU_CONV, "onednn").strip().lower() or "onednn"
    if value not in CHOICES:
        raise UserError(f"{PPMULTI_CPU_CONV}={value!r} is not one of {', '.join(CHOICES)}; unset it for oneDNN")
    return value


def cache_root() -> Path:
    """Where built ops live: outside any run or PPMULTI_HOME, so every run on this machine shares one build."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "ppmulti" / "ops"


def _paddle_dir() -> Path:
    """Paddle's package directory, found without importing paddle (seconds) when the op is already built."""
    package_dir = compat.paddle_package_dir()
    if package_dir is None:
        raise OpUnavailable("paddle is not installed")
    return package_dir


def _build_dir() -> Path:
    version = compat.paddle_build_id(_paddle_dir())
    tag = hashlib.sha1(SOURCE.read_bytes() + version + sys.version.encode()).hexdigest()[:12]
    return cache_root() / f"onednn_conv-{tag}"


def _include_dir() -> Path:
    """The include directory holding oneapi/dnnl/dnnl.hpp from the pinned headers package."""
    from importlib import metadata

    candidates = []
    with contextlib.suppress(metadata.PackageNotFoundError):
        for f in metadata.files(HEADERS_DIST) or []:
            if str(f).endswith("oneapi/dnnl/dnnl.hpp"):
                candidates.append(Path(f.locate()).parents[2])
    candidates.append(Path(sys.prefix) / "include")
    for inc in candidates:
        version = inc / "oneapi" / "dnnl" / "dnnl_version.h"
        if version.is_file() and "DNNL_VERSION_MAJOR 3" in version.read_text():
            return inc
    raise OpUnavailable(f"oneDNN 3 headers not found; pip install {HEADERS_DIST}==2023.2.0")


def _paddle_onednn() -> Path:
    library = compat.paddle_onednn_library(_paddle_dir())
    if not library.is_file():
        raise OpUnavailable(f"this Paddle build has no {library.name} in {library.parent}")
    return library


def _compile(build: Path) -> None:
    """Compile the op into ``build`` with Paddle's extension builder (about 20 s, once per machine)."""
    global _registered
    onednn, include = _paddle_onednn(), _include_dir()   # their own clear reasons, before any compiler runs
    libs = onednn.parent
    log.info("building the oneDNN convolution op for CPU training (once per Paddle version) in %s", build)
    try:
        # the builder's own chatter (stdout, and "Compiling user custom op..." logged at INFO) stays out of logs
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            logging.disable(logging.INFO)
            try:
                compat.build_custom_op(LIBRARY_NAME, sources=[str(SOURCE)], build_dir=build,
                                       include_dirs=[str(include)], cflags=["-O2"],
                                       ldflags=[f"-L{libs}", f"-l:{onednn.name}", f"-Wl,-rpath,{libs}"])
            finally:
                logging.disable(logging.NOTSET)
    except Exception as exc:   # a compiler error arrives as RuntimeError with the compiler's text
        first = next((line for line in str(exc).splitlines() if "error" in line.lower()), first_line(exc))
        raise OpUnavailable(f"building it failed: {first.strip()[:300]}") from exc
    _registered = True


def build_op() -> Path:
    """The op's shared library, compiled first when this machine has none for this source and Paddle.

    Several ranks may start at once: one builds under a file lock, the others wait. When the library
    exists this imports nothing heavy (no paddle). Raises OpUnavailable with the reason.
    """
    global _failure
    if _failure is not None:
        raise OpUnavailable(_failure)
    try:
        if not sys.platform.startswith("linux"):
            raise OpUnavailable("it is built for Linux only")
        from filelock import FileLock

        build = _build_dir()
        library = compat.custom_op_library(build, LIBRARY_NAME)
        build.mkdir(parents=True, exist_ok=True)
        with FileLock(str(build) + ".lock"):   # also while checking: the linker writes the .so in place
            if not library.is_file():
                _compile(build)
        if not library.is_file():
            raise OpUnavailable(f"the build left no {library}")
        return library
    except OpUnavailable as exc:
        _failure = str(exc)
        raise
    except OSError as exc:      # unwritable cache, missing compiler
        _failure = f"{type(exc).__name__}: {exc}"
        raise OpUnavailable(_failure) from exc


def _caller(name: str):
    """``f(x, weight, strides, paddings, groups=1, bias=None) -> y`` over the op ``name`` and its bias variant."""
    plain, with_bias = compat.custom_op_runner(name), compat.custom_op_runner(name + BIAS)

    def run(x, weight, strides, paddings, groups=1, bias=None):
        if bias is None:
            return plain(x, weight, list(strides), list(paddings), int(groups))[0]
        return with_bias(x, weight, bias, list(strides), list(paddings), int(groups))[0]

    return run


def load_op():
    """The op's caller ``f(x, weight, strides, paddings, groups=1, bias=None) -> y``, building and registering it
    first if needed.

    Raises OpUnavailable with the reason when this machine cannot build or load it.
    """
    global _op, _bf16_op, _failure, _registered
    if _op is not None:
        return _op
    library = build_op()
    if not _registered:
        try:
            names = compat.register_custom_op_library(library)
        except Exception as exc:   # noqa: BLE001 - a library that does not load: Paddle raises its own types
            _failure = f"loading {library} failed: {exc}"
            raise OpUnavailable(_failure) from exc
        if OP_NAME not in names:
            _failure = f"{library} does not define {OP_NAME}"
            raise OpUnavailable(_failure)
        _registered = True

    _op, _bf16_op = _caller(OP_NAME), _caller(BF16_OP_NAME)
    return _op


def load_bf16_op():
    """The bf16 variant's caller ``f(x, weight, strides, paddings, groups=1, bias=None) -> y``: float32 in and out,
    computed in bfloat16 with float32 accumulation (oneDNN), the bias float32. Raises OpUnavailable like
    ``load_op``."""
    load_op()
    return _bf16_op


def bf16_support() -> tuple[bool, bool]:
    """oneDNN's own view of bf16 here: (its ISA has AVX512-BF16 or AMX, its bf16 convolution is an optimised
    one rather than reference code). Raises OpUnavailable when the op cannot be loaded."""
    import paddle

    load_op()
    flags = compat.custom_op_runner(BF16_SUPPORT_OP_NAME)(paddle.zeros([1]))[0].numpy().tolist()
    return bool(flags[0]), bool(flags[1])


def eligible(layer) -> bool:
    """An NCHW Conv2D the op computes exactly: float32 weight (and bias, if any), any groups (depth-wise
    included), dilation 1, zero symmetric padding."""
    import paddle

    if type(layer) is not paddle.nn.Conv2D or (layer.bias is not None and layer.bias.dtype != paddle.float32):
        return False
    facts = compat.conv2d_facts(layer)
    return (list(facts.dilation) == [1, 1] and facts.data_format == "NCHW"
            and facts.padding_mode == "zeros" and facts.padding_algorithm == "EXPLICIT"
            and len(facts.padding) == 2 and layer.weight.dtype == paddle.float32)


def _forward_with(op, precision: str):
    def forward(self, x):
        import paddle

        facts = compat.conv2d_facts(self)
        if (not paddle.in_dynamic_mode() or x.dtype != paddle.float32 or not x.place.is_cpu_place()
                or x.ndim != 4 or x.shape[1] != self.weight.shape[1] * facts.groups):
            # a wrong input shape: Paddle's kernel says what is wrong (oneDNN would abort the process)
            return paddle.nn.Conv2D.forward(self, x)
        if not x.is_contiguous():
            x = x.contiguous()
        return op(x, self.weight, facts.stride, facts.padding, facts.groups, self.bias)

    forward.precision = precision   # what ``swapped_precision`` reads: "float32" or "bf16"
    return forward


def swapped_precision(layer) -> str | None:
    """"float32" or "bf16" for a Conv2D that ``use_onednn_convs`` routed through the op, None for any other."""
    method = layer.__dict__.get("forward")
    return getattr(getattr(method, "__func__", None), "precision", None)


def use_onednn_convs(model, bf16: bool = False) -> int:
    """Route every eligible Conv2D of ``model`` through the oneDNN op (its bf16 variant with ``bf16``);
    returns how many layers now use it.

    Only the layers' forward changes: parameters, state dicts and checkpoints stay as they are (float32),
    and models built elsewhere (export, evaluation tools) keep Paddle's own kernel.
    """
    load_op()
    forward = _forward_with(_bf16_op if bf16 else _op, "bf16" if bf16 else "float32")
    count = 0
    for layer in model.sublayers(include_self=True):
        if eligible(layer):
            layer.forward = types.MethodType(forward, layer)
            count += 1
    return count
