"""YOLOv5's pictures of a run's data: ``labels.jpg`` and ``labels_correlogram.jpg`` (the training labels),
``train_batch*.jpg`` and ``val_batch*_labels.jpg`` / ``_pred.jpg`` (image mosaics with their boxes); numpy, PIL
and matplotlib only."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ppmulti.common.atomic import atomic_save

LABELS_JPG = "labels.jpg"
CORRELOGRAM_JPG = "labels_correlogram.jpg"
BATCHES = 3            # train_batch0-2, val_batch0-2, as YOLOv5 draws them
MAX_TILES = 16         # images per mosaic
MAX_SIZE = 1920        # the mosaic's longer side at most
PRED_CONF = 0.25       # predictions drawn above this confidence
# tab20's colours, dark and light alternating, as (R, G, B)
PALETTE = [(31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40), (148, 103, 189), (140, 86, 75),
           (227, 119, 194), (127, 127, 127), (188, 189, 34), (23, 190, 207), (174, 199, 232), (255, 187, 120),
           (152, 223, 138), (255, 152, 150), (197, 176, 213), (196, 156, 148), (247, 182, 210), (199, 199, 199),
           (219, 219, 141), (158, 218, 229)]


def color(cls: int) -> tuple[int, int, int]:
    return PALETTE[int(cls) % len(PALETTE)]


@dataclass
class Batch:
    """One batch to draw: images as uint8 N x H x W x 3 RGB, per image its boxes (K, 6: class, x1, y1, x2, y2 in the
    image's pixels, confidence or NaN for labels) and a title (the file name)."""

    images: np.ndarray
    boxes: list[np.ndarray] = field(default_factory=list)
    titles: list[str] = field(default_factory=list)


def to_uint8(images: np.ndarray, mean=(0.0, 0.0, 0.0), std=(1.0, 1.0, 1.0), scale: float = 255.0,
             channels_first: bool = True) -> np.ndarray:
    """A normalised float batch back to uint8 N x H x W x 3: x * std + mean, times ``scale`` (255 when the
    normalisation worked on 0-1 pixels)."""
    x = np.asarray(images, dtype=np.float32)
    if channels_first:
        x = x.transpose(0, 2, 3, 1)
    x = x * np.asarray(std, dtype=np.float32) + np.asarray(mean, dtype=np.float32)
    return np.clip(x * scale, 0, 255).round().astype(np.uint8)


def _font(size: int):
    from PIL import ImageFont

    try:
        return ImageFont.load_default(size=size)
    except TypeError:   # Pillow < 10.1: one fixed-size bitmap font
        return ImageFont.load_default()


def draw_mosaic(batch: Batch, names: list[str], path: str | os.PathLike, conf_thres: float = PRED_CONF) -> None:
    """YOLOv5's ``plot_images``: up to 16 images on a square grid (white lines between them, the longer side at
    most 1920 px), each titled with its file name, boxes in their class's colour with the class name (and the
    confidence of a prediction; predictions at or under ``conf_thres`` left out). Written as JPEG."""
    from PIL import Image, ImageDraw

    images = batch.images[:MAX_TILES]
    n, h, w = images.shape[:3]
    side = math.ceil(math.sqrt(max(n, 1)))
    scale = min(1.0, MAX_SIZE / max(h, w) / side)
    th, tw = max(1, round(h * scale)), max(1, round(w * scale))
    canvas = Image.new("RGB", (side * tw, side * th), (255, 255, 255))
    draw = ImageDraw.Draw(canvas)
    font = _font(max(10, round(min(th, tw) / 25)))
    line = max(1, round(min(th, tw) / 200))
    for i in range(n):
        x0, y0 = (i % side) * tw, (i // side) * th
        canvas.paste(Image.fromarray(images[i]).resize((tw, th)), (x0, y0))
        boxes = batch.boxes[i] if i < len(batch.boxes) else np.zeros((0, 6))
        for cls, x1, y1, x2, y2, conf in np.asarray(boxes, dtype=np.float64).reshape(-1, 6):
            if not np.isnan(conf) and conf <= conf_thres:
                continue
            c = int(cls)
            # a box the model turned inside out, or far outside the image (an untrained head): drawn within its tile
            x1, x2 = np.clip(sorted((x1, x2)), 0, w)
            y1, y2 = np.clip(sorted((y1, y2)), 0, h)
            if not np.isfinite([x1, x2, y1, y2]).all():
                continue
            box = [x0 + x1 * scale, y0 + y1 * scale, x0 + x2 * scale, y0 + y2 * scale]
            draw.rectangle(box, outline=color(c), width=line)
            text = names[c] if 0 <= c < len(names) else str(c)
            text = text if np.isnan(conf) else f"{text} {conf:.1f}"
            left, top, right, bottom = draw.textbbox((box[0], box[1]), text, font=font)
            ty = max(y0, box[1] - (bottom - top) - 2)
            draw.rectangle([box[0], ty, box[0] + (right - left) + 2, ty + (bottom - top) + 2], fill=color(c))
            draw.text((box[0] + 1, ty), text, fill=(255, 255, 255), font=font)
        draw.rectangle([x0, y0, x0 + tw - 1, y0 + th - 1], outline=(255, 255, 255), width=max(1, line))
        if i < len(batch.titles) and batch.titles[i]:
            draw.text((x0 + 4, y0 + 2), Path(batch.titles[i]).name[:40], fill=(220, 220, 220), font=font)
    atomic_save(path, lambda tmp: canvas.save(tmp, format="JPEG", quality=90))


def _figure(width: float, height: float):
    from ppmulti.rank.engine.plots import _figure as figure

    return figure(width, height)


def plot_labels(classes: np.ndarray, boxes: np.ndarray, names: list[str], directory: str | os.PathLike) -> list[Path]:
    """YOLOv5's ``labels.jpg`` (instances per class; up to 1000 boxes drawn about one centre; box centres x
    against y; widths against heights) and ``labels_correlogram.jpg`` (x, y, width, height against each other:
    histograms on the diagonal, 2-D histograms elsewhere), of labels given as ``classes`` (n,) and ``boxes``
    (n, 4: x centre, y centre, width, height, as fractions of their image). Returns the files written."""
    from PIL import Image, ImageDraw

    out = Path(directory)
    classes = np.asarray(classes, dtype=np.int64).reshape(-1)
    boxes = np.asarray(boxes, dtype=np.float64).reshape(-1, 4)
    nc = max(len(names), int(classes.max()) + 1 if len(classes) else 0)
    columns = ["x", "y", "width", "height"]

    fig = _figure(8, 8)
    axes = [fig.add_subplot(2, 2, i + 1) for i in range(4)]
    counts = np.bincount(classes, minlength=nc)
    bars = axes[0].bar(range(nc), counts, width=0.8)
    for i, bar in enumerate(bars):
        bar.set_color(np.array(color(i)) / 255)
    axes[0].set_ylabel("instances")
    if 0 < nc < 30:
        axes[0].set_xticks(range(nc), [names[i] if i < len(names) else str(i) for i in range(nc)], rotation=90,
                           fontsize=8)
    else:
        axes[0].set_xlabel("classes")
    # up to 1000 boxes drawn about the image's centre: their sizes and shapes at a glance
    canvas = Image.new("RGB", (2000, 2000), (255, 255, 255))
    draw = ImageDraw.Draw(canvas)
    for cls, (_, _, bw, bh) in zip(classes[:1000], boxes[:1000]):
        draw.rectangle([1000 - bw * 1000, 1000 - bh * 1000, 1000 + bw * 1000, 1000 + bh * 1000],
                       outline=color(cls), width=2)
    axes[1].imshow(np.asarray(canvas))
    axes[1].axis("off")
    for ax, (a, b) in zip(axes[2:], ((0, 1), (2, 3))):
        ax.hist2d(boxes[:, a], boxes[:, b], bins=50, cmap="Blues", cmin=1, vmin=0)
        ax.set_xlabel(columns[a])
        ax.set_ylabel(columns[b])
    fig.subplots_adjust(left=0.08, right=0.97, bottom=0.1, top=0.97, wspace=0.25, hspace=0.3)
    atomic_save(out / LABELS_JPG, lambda tmp: fig.savefig(tmp, format="jpg", dpi=200))

    fig = _figure(8, 8)
    for i in range(4):
        for j in range(4):
            ax = fig.add_subplot(4, 4, i * 4 + j + 1)
            if i == j:
                ax.hist(boxes[:, i], bins=50, color="tab:blue", alpha=0.8)
            else:
                ax.hist2d(boxes[:, j], boxes[:, i], bins=50, cmap="Blues", cmin=1, vmin=0)
            if i == 3:
                ax.set_xlabel(columns[j])
            else:
                ax.set_xticklabels([])
            if j == 0:
                ax.set_ylabel(columns[i])
            elif i != j:
                ax.set_yticklabels([])
            ax.tick_params(labelsize=6)
    fig.subplots_adjust(left=0.08, right=0.98, bottom=0.07, top=0.98, wspace=0.08, hspace=0.08)
    atomic_save(out / CORRELOGRAM_JPG, lambda tmp: fig.savefig(tmp, format="jpg", dpi=200))
    return [out / LABELS_JPG, out / CORRELOGRAM_JPG]


def records_labels(records: list[dict]) -> tuple[np.ndarray, np.ndarray]:
    """(classes (n,), boxes (n, 4) x centre, y centre, width, height as fractions) of ppdet records' labels
    (``gt_bbox`` x1, y1, x2, y2 in pixels, ``gt_class``, ``w``, ``h``); crowd boxes left out."""
    classes, boxes = [], []
    for r in records:
        if "gt_bbox" not in r or "gt_class" not in r:
            continue
        gt = np.asarray(r["gt_bbox"], dtype=np.float64).reshape(-1, 4)
        cls = np.asarray(r["gt_class"]).reshape(-1)
        keep = np.asarray(r.get("is_crowd", np.zeros(len(gt)))).reshape(-1) == 0
        w, h = float(r.get("w") or 1), float(r.get("h") or 1)
        gt, cls = gt[keep], cls[keep]
        boxes.append(np.c_[(gt[:, 0] + gt[:, 2]) / 2 / w, (gt[:, 1] + gt[:, 3]) / 2 / h,
                           (gt[:, 2] - gt[:, 0]) / w, (gt[:, 3] - gt[:, 1]) / h])
        classes.append(cls)
    if not boxes:
        return np.zeros(0, dtype=np.int64), np.zeros((0, 4))
    return np.concatenate(classes).astype(np.int64), np.concatenate(boxes)


@dataclass
class ValBatch:
    """One evaluation batch to draw twice: its images (uint8 N x H x W x 3), labels and predictions per image
    (K, 6: class, x1, y1, x2, y2 in input pixels, confidence; NaN for labels) and file names."""

    images: np.ndarray
    labels: list[np.ndarray]
    preds: list[np.ndarray]
    titles: list[str]


def draw_val_batches(batches: list[ValBatch], names: list[str], directory: str | os.PathLike) -> list[Path]:
    """``val_batch{i}_labels.jpg`` and ``val_batch{i}_pred.jpg`` of the first batches of an evaluation."""
    out = Path(directory)
    written = []
    for i, b in enumerate(batches[:BATCHES]):
        for kind, boxes in (("labels", b.labels), ("pred", b.preds)):
            path = out / f"val_batch{i}_{kind}.jpg"
            draw_mosaic(Batch(b.images, boxes, b.titles), names, path)
            written.append(path)
    return written
