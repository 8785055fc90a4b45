"""ppmulti: multi-GPU and multi-machine YOLO training on PaddlePaddle, built on ppdet."""

__version__ = "0.1.0"


def version_line() -> str:
    """What `ppmulti --version` prints: ppmulti's version, then Python's, Paddle's and ppdet's from package metadata
    (nothing is imported, so it answers at once and even where Paddle is broken)."""
    import sys
    from importlib import metadata

    parts = [f"Python {sys.version.split()[0]}"]
    for dist in ("paddlepaddle", "paddlepaddle-gpu", "paddledet"):
        try:
            parts.append(f"{dist} {metadata.version(dist)}")
        except metadata.PackageNotFoundError:
            continue
    if not any(p.startswith("paddlepaddle") for p in parts):
        parts.append("no Paddle installed")
    return f"ppmulti {__version__} ({', '.join(parts)})"


def __getattr__(name: str):
    """``from ppmulti import YOLO`` (ultralytics' Python API), imported only when asked for."""
    if name == "YOLO":
        from ppmulti.procs.yolo_api import YOLO

        return YOLO
    raise AttributeError(f"module 'ppmulti' has no attribute {name!r}")
