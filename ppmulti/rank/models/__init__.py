"""ppmulti's models registered into ppdet's workspace (importing this package registers them): YOLOv5's parts,
UltraYOLO (YOLOv8 / YOLO11 / YOLO26) and RT-DETR."""

from ppmulti.rank import compat

compat.import_ppdet()  # before ppdet's modules load below, so its numba notice stays off stdout

from ppmulti.rank.models.yolov5 import YOLOv5CSPDarkNet, YOLOv5CSPPAN, register_once  # noqa: E402
from ppmulti.rank.models.yolov5_head import YOLOv5Head  # noqa: E402
from ppmulti.rank.models.yolov5_loss import YOLOv5Loss, bbox_ciou, build_targets  # noqa: E402
from ppmulti.rank.models.ultra_loss import UltraDetectionLoss, UltraE2ELoss  # noqa: E402
from ppmulti.rank.models.ultra_yolo import UltraYOLO  # noqa: E402
from ppmulti.rank.models import rtdetr  # noqa: E402,F401  (RT-DETR, PaddleDetection release/2.7)

__all__ = ["YOLOv5CSPDarkNet", "YOLOv5CSPPAN", "YOLOv5Head", "YOLOv5Loss", "bbox_ciou",
           "build_targets", "register_once", "UltraDetectionLoss", "UltraE2ELoss", "UltraYOLO"]
