"""A test-side writer of torch.save's file layout, without torch: a zip of NAME/data.pkl (pickle protocol 2 whose
tensors are persistent ids of storages), NAME/data/<key> (raw little-endian bytes, 64-byte aligned),
NAME/byteorder, NAME/version, as torch 2.x writes it; module objects are pickled under the class names a YOLOv5
checkpoint names (models.yolo.DetectionModel, torch.nn.modules.conv.Conv2d, ...). Checked against a real
torch.save file in tests/test_pretrained.py when torch is installed."""

from __future__ import annotations

import io
import pickle
import struct
import zipfile
from collections import OrderedDict
from pathlib import Path

import numpy as np

DTYPE_STORAGE = {np.dtype("float16"): "HalfStorage", np.dtype("float32"): "FloatStorage",
                 np.dtype("float64"): "DoubleStorage", np.dtype("int64"): "LongStorage",
                 np.dtype("int32"): "IntStorage", np.dtype("uint8"): "ByteStorage", np.dtype("bool"): "BoolStorage"}


def _named(module: str, name: str):
    """A class (or function) that pickles as ``module.name`` without that module existing here."""
    return type(name, (), {"_pt_name": (module, name)})


_REBUILD_TENSOR = _named("torch._utils", "_rebuild_tensor_v2")
_REBUILD_PARAMETER = _named("torch._utils", "_rebuild_parameter")
_STORAGES = {dt: _named("torch", name) for dt, name in DTYPE_STORAGE.items()}


class Storage:
    def __init__(self, array: np.ndarray):
        self.array = np.ascontiguousarray(array).reshape(-1)


class Tensor:
    """A tensor as torch pickles it: _rebuild_tensor_v2(storage, offset, size, stride, requires_grad, hooks);
    ``base`` lets several tensors share one storage (a view)."""

    def __init__(self, array, parameter: bool = False, storage: Storage | None = None, offset: int = 0,
                 stride: tuple | None = None):
        array = np.asarray(array)
        self.storage = storage or Storage(array)
        self.offset, self.size = offset, tuple(array.shape)
        self.stride = stride if stride is not None else tuple(
            int(np.prod(array.shape[i + 1:])) for i in range(array.ndim))
        self.parameter = parameter

    def __reduce_ex__(self, protocol):
        tensor = (_REBUILD_TENSOR, (self.storage, self.offset, self.size, self.stride, False, OrderedDict()))
        if self.parameter:
            return (_REBUILD_PARAMETER, (_Reduced(tensor), True, OrderedDict()))
        return tensor


class _Reduced:
    def __init__(self, reduced):
        self.reduced = reduced

    def __reduce_ex__(self, protocol):
        return self.reduced


_NEWOBJ = object()


class Module:
    """An nn.Module as torch pickles it (cls.__new__ by NEWOBJ, then its __dict__ by BUILD), named ``module.name``."""

    def __init__(self, cls: str, parameters=None, buffers=None, modules=None, **attrs):
        self.cls = cls
        self.state = {"training": False, "_parameters": OrderedDict(parameters or {}),
                      "_buffers": OrderedDict(buffers or {}), "_non_persistent_buffers_set": set(),
                      "_backward_hooks": OrderedDict(), "_forward_hooks": OrderedDict(),
                      "_forward_pre_hooks": OrderedDict(), "_modules": OrderedDict(modules or {}), **attrs}

    def __reduce_ex__(self, protocol):
        module, _, name = self.cls.rpartition(".")
        return (_NEWOBJ, (_named(module, name),), self.state)


class _Pickler(pickle._Pickler):
    """Protocol 2, storages as persistent ids ('storage', StorageClass, key, 'cpu', numel), named classes as
    GLOBAL records."""

    def __init__(self, file):
        super().__init__(file, protocol=2)
        self.storages: dict[int, tuple[str, Storage]] = {}

    def persistent_id(self, obj):
        if isinstance(obj, Storage):
            if id(obj) not in self.storages:
                self.storages[id(obj)] = (str(len(self.storages)), obj)
            key = self.storages[id(obj)][0]
            return ("storage", _STORAGES[obj.array.dtype], key, "cpu", obj.array.size)
        return None

    def save_reduce(self, func, args, state=None, *rest, obj=None):
        if func is not _NEWOBJ:
            return super().save_reduce(func, args, state, *rest, obj=obj)
        self.save(args[0])
        self.save(())
        self.write(pickle.NEWOBJ)
        self.memoize(obj)
        self.save(state)
        self.write(pickle.BUILD)

    def save_global(self, obj, name=None):
        pt = getattr(obj, "_pt_name", None)
        if pt is None:
            return super().save_global(obj, name)
        self.write(pickle.GLOBAL + f"{pt[0]}\n{pt[1]}\n".encode())
        self.memoize(obj)


def save(obj, path, archive: str | None = None) -> Path:
    """Write ``obj`` as torch.save would: returns the path."""
    path = Path(path)
    buf = io.BytesIO()
    pickler = _Pickler(buf)
    pickler.dump(obj)
    name = archive or path.stem
    records = [("data.pkl", buf.getvalue()), (".format_version", b"1"), (".storage_alignment", b"64"),
               ("byteorder", b"little")]
    records += [(f"data/{key}", storage.array.astype(storage.array.dtype.newbyteorder("<")).tobytes())
                for key, storage in pickler.storages.values()]
    records += [("version", b"3\n")]
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as zf:
        for rec, data in records:
            info = zipfile.ZipInfo(f"{name}/{rec}", date_time=(1980, 1, 1, 0, 0, 0))
            header = 30 + len(info.filename.encode())
            pad = (-(zf.fp.tell() + header + 4)) % 64   # torch pads each record's data to 64 bytes ("FB" field)
            info.extra = b"FB" + struct.pack("<H", pad) + b"Z" * pad
            zf.writestr(info, data)
    return path


def module_tree(state: dict, root: str, classes: dict | None = None, parameter=lambda name: True,
                **attrs) -> Module:
    """A Module tree (class ``root`` at the top) whose ``state_dict()`` is ``state`` (flat ``a.b.weight`` names ->
    arrays), as torch pickles a model: each dotted prefix a child module. ``classes`` names the class of a child
    by its dotted path (``{"model.23": "ultralytics.nn.modules.head.Detect"}``); other children are named as
    torch's Sequential, BatchNorm2d (those holding ``running_mean``) or Conv2d. ``parameter(name)`` says which
    entries are parameters (the others buffers: BatchNorm's running statistics and counter)."""
    classes = classes or {}
    nodes: dict[str, dict] = {"": {"parameters": OrderedDict(), "buffers": OrderedDict(), "modules": OrderedDict()}}
    for name, value in state.items():
        path, _, leaf = name.rpartition(".")
        parts = path.split(".") if path else []
        for i in range(len(parts) + 1):
            key = ".".join(parts[:i])
            nodes.setdefault(key, {"parameters": OrderedDict(), "buffers": OrderedDict(), "modules": OrderedDict()})
        is_param = parameter(name) and leaf not in ("running_mean", "running_var", "num_batches_tracked")
        nodes[path]["parameters" if is_param else "buffers"][leaf] = Tensor(value, parameter=is_param)

    def build(key: str) -> Module:
        node = nodes[key]
        children = OrderedDict((k.rsplit(".", 1)[-1], build(k)) for k in nodes
                               if k and k.rpartition(".")[0] == key and k != key)
        if key == "":
            cls = root
        elif key in classes:
            cls = classes[key]
        elif "running_mean" in node["buffers"]:
            cls = "torch.nn.modules.batchnorm.BatchNorm2d"
        elif node["parameters"] and not children:
            cls = "torch.nn.modules.conv.Conv2d"
        else:
            cls = "torch.nn.modules.container.Sequential"
        extra = attrs if key == "" else {}
        return Module(cls, node["parameters"], node["buffers"], children, **extra)

    return build("")
