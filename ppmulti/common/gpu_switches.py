"""PyTorch's determinism and cuDNN-benchmark switches as Paddle's flags: which ones a run sets in every rank."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from ppmulti.common.envvars import CUBLAS_WORKSPACE_CONFIG
from ppmulti.common.errors import UserError

# torch.backends.cudnn.deterministic / torch.use_deterministic_algorithms, as far as Paddle has switches for them.
# Paddle refuses a convolution when deterministic and exhaustive search are both on, so each mode clears the other.
DETERMINISTIC_FLAGS: dict[str, bool | int] = {
    "FLAGS_cudnn_deterministic": True,       # deterministic cuDNN algorithms (convolutions, pooling, ...)
    "FLAGS_cudnn_exhaustive_search": False,
    "FLAGS_cudnn_batchnorm_spatial_persistent": False,   # the faster BatchNorm mode cuDNN does not promise to repeat
    "FLAGS_embedding_deterministic": 1,      # embedding gradients summed in a fixed order
    "FLAGS_cpu_deterministic": True,         # Paddle 2.6: CPU gradient reductions in a fixed order
}
DETERMINISTIC_ENV = {CUBLAS_WORKSPACE_CONFIG: ":4096:8"}   # cuBLAS's own condition for repeatable GEMMs
# torch.backends.cudnn.benchmark = True
BENCHMARK_FLAGS: dict[str, bool | int] = {
    "FLAGS_cudnn_exhaustive_search": True,   # time every convolution algorithm once per shape, keep the fastest
    "FLAGS_cudnn_deterministic": False,
}
# a user who exports one of these has chosen already: YOLOv5's deterministic default then leaves them alone
USER_CHOICE = ("FLAGS_cudnn_deterministic", "FLAGS_cudnn_exhaustive_search")


@dataclass(frozen=True)
class Switches:
    """What a run sets: ``flags`` through paddle.set_flags in every rank (those this Paddle build defines),
    ``env`` in every rank's environment unless already set; ``mode`` and ``why`` for the log line."""

    mode: str = "default"      # "deterministic", "benchmark" or "default" (Paddle's own settings)
    why: str = ""
    flags: dict[str, bool | int] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)


def resolve(deterministic: bool | None, benchmark: bool, yolo_style: bool,
            environ: Mapping[str, str]) -> Switches:
    """``--deterministic/--no-deterministic`` (None: not given), ``--cudnn-benchmark``, whether the command line
    is YOLOv5's, and the environment -> the switches of the run."""
    if deterministic and benchmark:
        raise UserError("--deterministic and --cudnn-benchmark ask for opposite things (repeatable kernels vs the "
                        "fastest ones); give one of them")
    if benchmark:
        return Switches("benchmark", "--cudnn-benchmark", dict(BENCHMARK_FLAGS))
    if deterministic:
        return Switches("deterministic", "--deterministic", dict(DETERMINISTIC_FLAGS), dict(DETERMINISTIC_ENV))
    if deterministic is False:
        return Switches("default", "--no-deterministic")
    if yolo_style:
        chosen = [k for k in USER_CHOICE if k in environ]
        if chosen:
            return Switches("default", f"{chosen[0]} set in the environment")
        return Switches("deterministic", "YOLOv5 command line (YOLOv5 trains deterministically)",
                        dict(DETERMINISTIC_FLAGS), dict(DETERMINISTIC_ENV))
    return Switches("default", "-c command line")
