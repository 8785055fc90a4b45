"""The Trainer's entry to the op library on CPU: the user's choice applied to a model's convolutions and SiLUs."""

from __future__ import annotations

import logging

from ppmulti.common.envvars import PPMULTI_CPU_CONV
from ppmulti.rank.ops import conv, silu

log = logging.getLogger("ppmulti")


def setup_cpu_ops(model, bf16: bool = False) -> str:
    """Route ``model``'s convolutions (``bf16``: --amp on a CPU the AMP module found able) and YOLOv5's fused
    SiLUs through the oneDNN ops, unless PPMULTI_CPU_CONV=paddle; one line says what was used and, if needed,
    why. SiLU stays float32 in both modes: bf16 runs only inside the convolutions."""
    if conv.choice() == "paddle":
        return f"Paddle's conv2d ({PPMULTI_CPU_CONV}=paddle)"
    try:
        n = conv.use_onednn_convs(model, bf16=bf16)
        n_silu = silu.use_onednn_silus(model)
    except conv.OpUnavailable as exc:
        log.warning("CPU convolutions use Paddle's own kernel, about 2x slower to train: %s "
                    "(set %s=paddle to choose it and silence this)", exc, PPMULTI_CPU_CONV)
        return f"Paddle's conv2d (oneDNN op unavailable: {exc})"
    return (f"oneDNN {'bfloat16 (float32 accumulation and weights)' if bf16 else 'float32'} for {n} conv layers; "
            f"oneDNN SiLU in {n_silu} layers")
