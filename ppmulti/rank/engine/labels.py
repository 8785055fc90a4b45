"""YOLO-format label files of detections: boxes clipped to the image, `class xc yc w h [conf]` lines, read back."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def clip_boxes(dets: np.ndarray, width: float, height: float) -> np.ndarray:
    """Rows x1, y1, x2, y2, ... with the corners clipped to the image (YOLOv5 clips before it writes or draws)."""
    out = dets.copy()
    out[:, [0, 2]] = out[:, [0, 2]].clip(0, width)
    out[:, [1, 3]] = out[:, [1, 3]].clip(0, height)
    return out


def label_lines(dets: np.ndarray, width: int, height: int, save_conf: bool) -> list[str]:
    """YOLOv5's label format: ``class xc yc w h [conf]``, coordinates normalised by the image size."""
    lines = []
    for x1, y1, x2, y2, conf, cls in dets:
        row = [int(cls), (x1 + x2) / 2 / width, (y1 + y2) / 2 / height, (x2 - x1) / width, (y2 - y1) / height]
        if save_conf:
            row.append(conf)
        lines.append(" ".join(f"{v:g}" for v in row))
    return lines


def read_label_file(path: Path) -> np.ndarray:
    """A label file written with --save-conf back as rows class, xc, yc, w, h, conf (for comparisons)."""
    text = path.read_text().split() if path.is_file() else []
    return np.asarray([float(v) for v in text], dtype=np.float64).reshape(-1, 6)
