"""ppmulti's models registered into ppdet's workspace (importing this package registers them)."""

from ppmulti.ppdet_ext import quiet_import_ppdet

quiet_import_ppdet()  # before ppdet's modules load below, so its numba notice stays off stdout

from ppmulti.models.yolov5 import YOLOv5CSPDarkNet, YOLOv5CSPPAN, register_once  # noqa: E402
from ppmulti.models.yolov5_head import YOLOv5Head  # noqa: E402
from ppmulti.models.yolov5_loss import YOLOv5Loss, bbox_ciou, build_targets  # noqa: E402

__all__ = ["YOLOv5CSPDarkNet", "YOLOv5CSPPAN", "YOLOv5Head", "YOLOv5Loss", "bbox_ciou",
           "build_targets", "register_once"]
