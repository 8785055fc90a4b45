"""The model's float input made on the device from the uint8 batch the loader hands over (/255, mean/std, and
YOLOv5's HSV gains when the reader leaves them to the device)."""

from __future__ import annotations

from ppmulti.common.yamlread import reader_ops


def input_norm(cfg) -> tuple[list[float], list[float], bool] | None:
    """(mean, std, channels_last) of the train reader's DeviceNormalize op (0-1 units), or None without one."""
    for body in reader_ops(cfg, "DeviceNormalize"):
        return ([float(v) for v in body.get("mean", (0.0, 0.0, 0.0))],
                [float(v) for v in body.get("std", (1.0, 1.0, 1.0))], bool(body.get("channels_last")))
    return None


def place_hsv(cfg, device: str) -> bool | None:
    """Resolve the train reader's ``YOLOv5HSV.on_device: auto`` for the device the ranks train on: on a GPU the
    HSV gains are applied there (the loader hands over BGR uint8 and the gains), on a CPU in the loader workers,
    which run beside the training threads (on a CPU the device's version costs about 80x the host's:
    142 against 1.8 ms per 640 px image, bench/loader_vs_yolov5.py).
    ``true``/``false`` in the config are kept. Returns the placement, or None without a YOLOv5HSV op."""
    placed = None
    for op in reader_ops(cfg, "YOLOv5HSV"):
        if str(op.get("on_device", "auto")).lower() == "auto":
            op["on_device"] = device == "gpu"
        placed = bool(op["on_device"])
    return placed


def host_normalize(cfg) -> bool:
    """Put the normalisation back on the host for a consumer of the train reader that is not ppmulti's Trainer
    (ppdet's own Trainer in ``ppmulti bench``'s reference case): DeviceNormalize becomes ppdet's NormalizeImage
    (and Permute when channels_last). Returns whether anything changed."""
    norm = input_norm(cfg)
    if norm is None:
        return False
    for op in reader_ops(cfg, "YOLOv5HSV"):
        op["on_device"] = False
    mean, std, channels_last = norm
    ops = cfg["TrainReader"]["batch_transforms"]
    at = next(i for i, op in enumerate(ops) if isinstance(op, dict) and "DeviceNormalize" in op)
    host = [{"NormalizeImage": {"mean": mean, "std": std, "is_scale": True}}]
    if channels_last:
        host.append({"Permute": {}})
    cfg["TrainReader"]["batch_transforms"] = ops[:at] + host + ops[at + 1:]
    return True


def to_model_input(data: dict, norm: tuple | None = None) -> dict:
    """The model's float input from the batch the loader handed over, made on the tensor's device.

    A batch with ``hsv_gain`` (N x 3, YOLOv5HSV with on_device) holds BGR pixels: they get YOLOv5's HSV gains
    and become RGB here (``hsv_on_device``) before the division.
    With ``norm`` (the reader ends in DeviceNormalize) every batch is raw pixels on the 0-255 scale, uint8 (the
    YOLOv5 reader) or float32 (PP-YOLOE's RandomDistort leaves floats): N x H x W x 3 permuted to N x 3 x H x W
    if channels_last, then float32, / 255, (x - mean) / std per channel. Without ``norm`` a uint8 batch is only
    divided by 255 and a float batch is taken as already normalised by the loader.
    """
    import paddle

    image = data.get("image")
    gains = data.pop("hsv_gain", None)
    if image is None or not isinstance(image, paddle.Tensor):
        return data
    if norm is None and image.dtype != paddle.uint8:
        return data
    if norm is not None and norm[2]:
        image = image.transpose([0, 3, 1, 2])
    if gains is not None:
        gains = gains if isinstance(gains, paddle.Tensor) else paddle.to_tensor(gains)
        image = hsv_on_device(image, gains.astype("float32"))
    x = image.astype("float32") * (1.0 / 255.0)
    if norm is not None:
        mean, std, _ = norm
        if any(mean) or any(s != 1.0 for s in std):
            m = paddle.to_tensor(mean, dtype="float32").reshape([1, -1, 1, 1])
            s = paddle.to_tensor(std, dtype="float32").reshape([1, -1, 1, 1])
            x = (x - m) / s
    data["image"] = x
    return data


# OpenCV's HSV-to-BGR sectors: for each of B, G, R, which of (v, p, q, t) it takes in sectors 0-5
_SECTORS = ((1, 1, 3, 0, 0, 2), (3, 0, 0, 2, 1, 1), (0, 2, 1, 1, 3, 0))


def hsv_on_device(image, gains):
    """YOLOv5's augment_hsv on the device: ``image`` N x 3 x H x W BGR on the 0-255 scale (uint8 or integral
    floats), ``gains`` N x 3 (H, S, V multipliers, ``augment.hsv_gains``); returns float32 RGB, integral values.

    The steps are the ones cv2 takes on the host (``augment.augment_hsv``): OpenCV's 8-bit BGR to HSV (H in
    0-179) with its integer reciprocal tables (the same H, S and V as cv2's), the gains through per-image lookup
    tables built in float64 as the host builds them (H times gain modulo 180, S and V times gain clipped to 255,
    truncated), and the conversion back through the six hue sectors in float32. cv2's vectorised conversion
    back truncates where its scalar one rounds; this truncates, as cv2 does on images wider than a few pixels:
    about 1 value in 75 ends 1 away from cv2's (tests/test_pipeline.py).
    """
    import paddle

    x = image.astype("int32")
    b, g, r = x[:, 0], x[:, 1], x[:, 2]
    v = paddle.maximum(paddle.maximum(r, g), b)
    diff = v - paddle.minimum(paddle.minimum(r, g), b)
    vf, df = v.astype("float32"), diff.astype("float32")
    shift = paddle.full([1], 4096, "int32")   # OpenCV's hsv_shift of 12 bits
    # S = diff * round(255 << 12 / v) >> 12, rounded; H = hue * round(180 << 12 / (6 diff)) >> 12, rounded
    sdiv = paddle.where(v > 0, paddle.round(1044480.0 / paddle.clip(vf, min=1.0)), paddle.zeros_like(vf))
    s = paddle.floor_divide(diff * sdiv.astype("int32") + 2048, shift)
    hdiv = paddle.where(diff > 0, paddle.round(122880.0 / paddle.clip(df, min=1.0)), paddle.zeros_like(df))
    hue = paddle.where(v == r, g - b, paddle.where(v == g, b - r + 2 * diff, r - g + 4 * diff))
    # hue is at least -diff: 31 x 4096 keeps the numerator positive, so the division floors as the shift does
    h = paddle.floor_divide(hue * hdiv.astype("int32") + 2048 + 31 * 4096, shift) - 31
    h = paddle.where(h < 0, h + 180, h)
    # each image's lookup tables in float64, as the host builds them (in float32 a product a hair below an
    # integer can round up to it, and one hue step moves a saturated pixel by up to 8 of 255)
    level = paddle.arange(256, dtype="float64").reshape([1, 256])
    g = gains.astype("float64")
    luts = (paddle.floor(paddle.remainder(level * g[:, 0:1], paddle.full([1], 180.0, "float64"))),
            paddle.floor(paddle.clip(level * g[:, 1:2], 0.0, 255.0)),
            paddle.floor(paddle.clip(level * g[:, 2:3], 0.0, 255.0)))
    h, s, v = (paddle.take_along_axis(lut, c.reshape([c.shape[0], -1]).astype("int64"), axis=1)
               .reshape(c.shape).astype("float32") for lut, c in zip(luts, (h, s, v)))
    s, v = s * (1.0 / 255.0), v * (1.0 / 255.0)
    h = h * (6.0 / 180.0)
    sector = paddle.floor(h)
    f = h - sector
    weights = (paddle.zeros_like(f), paddle.ones_like(f), f, 1.0 - f)   # v, p, q, t as v x (1 - s x weight)
    flat = sector.astype("int64").flatten()
    out = []
    for channel in (2, 1, 0):   # R, G, B
        which = paddle.gather(paddle.to_tensor(_SECTORS[channel], dtype="int64"), flat).reshape(sector.shape)
        w = paddle.where(which == 0, weights[0], paddle.where(which == 1, weights[1],
                                                               paddle.where(which == 2, weights[2], weights[3])))
        out.append(paddle.floor(v * (1.0 - s * w) * 255.0))
    return paddle.stack(out, 1)
