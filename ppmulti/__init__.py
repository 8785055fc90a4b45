"""ppmulti: multi-GPU and multi-machine YOLO training on PaddlePaddle, built on ppdet."""

from ppmulti.common.version import __version__, version_line  # noqa: F401 (the package's public names)


def __getattr__(name: str):
    """``from ppmulti import YOLO`` (ultralytics' Python API), imported only when asked for."""
    if name == "YOLO":
        from ppmulti.procs.yolo_api import YOLO

        return YOLO
    raise AttributeError(f"module 'ppmulti' has no attribute {name!r}")
