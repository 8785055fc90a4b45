"""RT-DETR (PaddleDetection release/2.7) in ppdet 2.6.0's workspace: the hybrid encoder, the RT-DETR decoder, the
HGNetv2 backbone and release/2.7's DETRPostProcess under the names its configs use (importing registers them);
the modules 2.6.0 already names are replaced by ``release27_overrides`` (see release27.py)."""

from ppmulti.rank import compat

compat.import_ppdet()

from ppmulti.rank.models.rtdetr.decoder import RTDETRTransformer  # noqa: E402
from ppmulti.rank.models.rtdetr.encoder import HybridEncoder, TransformerLayer  # noqa: E402
from ppmulti.rank.models.rtdetr.hgnetv2 import PPHGNetV2  # noqa: E402
from ppmulti.rank.models.rtdetr.release27 import DETRPostProcess  # noqa: E402
from ppmulti.rank.models.yolov5 import register_once  # noqa: E402

register_once(DETRPostProcess)

__all__ = ["HybridEncoder", "TransformerLayer", "RTDETRTransformer", "DETRPostProcess", "PPHGNetV2"]


def release27_overrides() -> list[str]:
    """Put release/2.7's versions of the modules and reader ops ppdet 2.6.0 already names in its workspace and
    reader (R27), through the version seam. Idempotent; returns the names replaced now."""
    from ppmulti.rank.models.rtdetr import release27

    done = [cls.__name__ for cls in release27.OVERRIDES if compat.override_registered_module(cls)]
    return done + [cls.__name__ for cls in release27.TRANSFORM_OVERRIDES if compat.override_transform(cls)]
