"""The model's float input made on the device from the uint8 batch the loader hands over (/255, mean/std)."""

from __future__ import annotations


def input_norm(cfg) -> tuple[list[float], list[float], bool] | None:
    """(mean, std, channels_last) of the train reader's DeviceNormalize op (0-1 units), or None without one."""
    reader = (cfg or {}).get("TrainReader") or {}
    for kind in ("batch_transforms", "sample_transforms"):
        for op in reader.get(kind) or []:
            if isinstance(op, dict) and "DeviceNormalize" in op:
                body = op["DeviceNormalize"] or {}
                return ([float(v) for v in body.get("mean", (0.0, 0.0, 0.0))],
                        [float(v) for v in body.get("std", (1.0, 1.0, 1.0))], bool(body.get("channels_last")))
    return None


def host_normalize(cfg) -> bool:
    """Put the normalisation back on the host for a consumer of the train reader that is not ppmulti's Trainer
    (ppdet's own Trainer in ``ppmulti bench``'s reference case): DeviceNormalize becomes ppdet's NormalizeImage
    (and Permute when channels_last). Returns whether anything changed."""
    norm = input_norm(cfg)
    if norm is None:
        return False
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

    With ``norm`` (the reader ends in DeviceNormalize) every batch is raw pixels on the 0-255 scale, uint8 (the
    YOLOv5 reader) or float32 (PP-YOLOE's RandomDistort leaves floats): N x H x W x 3 permuted to N x 3 x H x W
    if channels_last, then float32, / 255, (x - mean) / std per channel. Without ``norm`` a uint8 batch is only
    divided by 255 and a float batch is taken as already normalised by the loader.
    """
    import paddle

    image = data.get("image")
    if image is None or not isinstance(image, paddle.Tensor):
        return data
    if norm is None and image.dtype != paddle.uint8:
        return data
    if norm is not None and norm[2]:
        image = image.transpose([0, 3, 1, 2])
    x = image.astype("float32") * (1.0 / 255.0)
    if norm is not None:
        mean, std, _ = norm
        if any(mean) or any(s != 1.0 for s in std):
            m = paddle.to_tensor(mean, dtype="float32").reshape([1, -1, 1, 1])
            s = paddle.to_tensor(std, dtype="float32").reshape([1, -1, 1, 1])
            x = (x - m) / s
    data["image"] = x
    return data
