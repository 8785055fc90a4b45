"""Reading a PyTorch .pt file (torch.save's zip of pickles) into numpy arrays, without torch and without running
any code the file names: a restricted unpickler that resolves only tensor rebuilding, storages and containers,
and turns every torch.nn / YOLOv5 / ultralytics 8.x module class into an inert stand-in that keeps its pickled
attributes."""

from __future__ import annotations

import builtins
import pickle
import zipfile
from collections import OrderedDict
from typing import Any

from ppmulti.common.errors import UserError

# torch's storage classes by name -> numpy dtype name; bytes are little-endian (torch.save's `byteorder` record).
STORAGE_DTYPES = {
    "HalfStorage": "<f2", "FloatStorage": "<f4", "DoubleStorage": "<f8", "BFloat16Storage": "bfloat16",
    "LongStorage": "<i8", "IntStorage": "<i4", "ShortStorage": "<i2", "CharStorage": "i1", "ByteStorage": "u1",
    "BoolStorage": "?",
}
# Module prefixes whose classes become stand-ins: torch's layers, YOLOv5's model code (models/yolo.py, common.py)
# and ultralytics 8.x's (its nn modules and the namespaces it keeps arguments in).
STANDIN_MODULES = ("torch.nn.modules.", "models.yolo", "models.common", "models.experimental", "pathlib",
                   "ultralytics.nn.", "ultralytics.utils")
# YOLOv5 heads of tasks ppmulti does not train; refused by name before anything else is read.
REFUSED = {
    ("models.yolo", "SegmentationModel"): "a YOLOv5 segmentation model (ppmulti trains detection models)",
    ("models.yolo", "Segment"): "a YOLOv5 segmentation model (ppmulti trains detection models)",
    ("models.yolo", "ClassificationModel"): "a YOLOv5 classification model (ppmulti trains detection models)",
    ("models.common", "Classify"): "a YOLOv5 classification model (ppmulti trains detection models)",
}
_BUILTINS = {"set", "frozenset", "slice", "tuple", "list", "dict", "bool", "int", "float", "complex", "bytes",
             "bytearray", "str", "range"}
_NUMPY = {"_reconstruct", "scalar", "ndarray", "dtype"}   # a pickled numpy value (train.py's best_fitness)


class StandIn:
    """An object of a class the file names (torch.nn.Conv2d, YOLOv5's Conv, ...): holds the pickled state, runs
    nothing. ``pt_class`` says which class it stands for."""

    pt_class = "?"

    def __init__(self, *args, **kwargs):
        self.args = args

    def __setstate__(self, state):
        if isinstance(state, tuple) and len(state) == 2 and isinstance(state[0], (dict, type(None))):
            state = {**(state[0] or {}), **(state[1] or {})}   # (dict, slots) states
        self.__dict__.update(state if isinstance(state, dict) else {"state": state})

    def __repr__(self):
        return f"<{self.pt_class}>"


class Tensor:
    """A tensor of the file: read from its storage when ``numpy()`` is called."""

    def __init__(self, storage: "_Storage", offset: int, size: tuple, stride: tuple):
        self.storage, self.offset, self.shape, self.stride = storage, offset, tuple(size), tuple(stride)

    def numpy(self):
        import numpy as np

        flat = self.storage.array()
        if not self.shape:
            return flat[self.offset].copy()
        item = flat.itemsize
        view = np.lib.stride_tricks.as_strided(flat[self.offset:], shape=self.shape,
                                               strides=tuple(s * item for s in self.stride))
        return np.array(view)   # a copy: the file's buffer is not kept alive by the result

    def __repr__(self):
        return f"Tensor({self.storage.dtype}, {list(self.shape)})"


class _Storage:
    def __init__(self, archive: zipfile.ZipFile, record: str, dtype: str, numel: int):
        self.archive, self.record, self.dtype, self.numel = archive, record, dtype, numel
        self._array = None

    def array(self):
        import numpy as np

        if self._array is None:
            raw = self.archive.read(self.record)
            if self.dtype == "bfloat16":   # the upper half of a float32
                arr = (np.frombuffer(raw, "<u2").astype(np.uint32) << 16).view(np.float32)
            else:
                arr = np.frombuffer(raw, self.dtype)
            if arr.size < self.numel:
                raise UserError(f"{self.archive.filename}: storage {self.record} is truncated "
                                f"({arr.size} of {self.numel} values); the file is damaged")
            self._array = arr
        return self._array


def _rebuild_tensor_v2(storage, offset, size, stride, *rest):
    return Tensor(storage, offset, size, stride)


def _rebuild_parameter(data, *rest):
    return data


def _encode(text, encoding="latin1"):
    return str(text).encode(encoding if encoding in ("latin1", "latin-1", "utf-8", "utf8") else "latin1")


def _numpy_value(*args):
    return StandIn(*args)


class _Unpickler(pickle.Unpickler):
    def __init__(self, file, archive: zipfile.ZipFile, prefix: str, source: str):
        super().__init__(file)
        self.archive, self.prefix, self.source = archive, prefix, source
        self.storages: dict[str, _Storage] = {}
        self.classes: set[str] = set()

    def find_class(self, module: str, name: str):
        if (module, name) in REFUSED:
            raise UserError(f"{self.source}: {REFUSED[module, name]}; give YOLOv5 detection weights "
                            f"(yolov5n/s/m/l/x.pt) or a .pdparams")
        if module == "torch._utils" and name == "_rebuild_tensor_v2":
            return _rebuild_tensor_v2
        if module == "torch._utils" and name in ("_rebuild_parameter", "_rebuild_parameter_with_state"):
            return _rebuild_parameter
        if module == "torch" and name in STORAGE_DTYPES:
            return STORAGE_DTYPES[name]
        if module == "torch" and name == "Size":   # a shape ultralytics' Detect keeps (its last input's)
            return tuple
        if module == "collections" and name == "OrderedDict":
            return OrderedDict
        if module in ("builtins", "__builtin__") and name in _BUILTINS:
            return getattr(builtins, name)
        if module in ("numpy", "numpy.core.multiarray", "numpy._core.multiarray") and name in _NUMPY:
            return _numpy_value
        if module == "_codecs" and name == "encode":   # protocol 2's form of bytes (inside numpy values)
            return _encode
        if module.startswith(STANDIN_MODULES) or module in STANDIN_MODULES:
            self.classes.add(f"{module}.{name}")
            return type(name, (StandIn,), {"__module__": "ppmulti.common.torchpt", "pt_class": f"{module}.{name}"})
        raise UserError(f"{self.source}: the file names {module}.{name}, which a YOLOv5 or ultralytics weights "
                        f"file does not hold; it is refused unread (only tensors, torch layers and YOLOv5's and "
                        f"ultralytics' model classes are)")

    def persistent_load(self, pid):
        if not (isinstance(pid, tuple) and len(pid) >= 5 and pid[0] == "storage"):
            raise UserError(f"{self.source}: unknown persistent record {str(pid)[:60]}")
        _, dtype, key, _location, numel = pid[:5]
        if not isinstance(dtype, str):
            raise UserError(f"{self.source}: a storage of an unsupported type ({dtype!r})")
        if key not in self.storages:
            self.storages[key] = _Storage(self.archive, f"{self.prefix}data/{key}", dtype, int(numel))
        return self.storages[key]


def load(path: str) -> Any:
    """The object a torch.save file holds, with tensors as lazy ``Tensor``s and module objects as ``StandIn``s.

    Raises UserError naming the file for anything that is not a torch.save zip this reader can read safely.
    """
    try:
        archive = zipfile.ZipFile(path)
    except FileNotFoundError:
        raise UserError(f"{path}: file not found") from None
    except (zipfile.BadZipFile, OSError) as exc:
        hint = " (an HTML page? a failed download?)" if _starts_with(path, b"<") else ""
        raise UserError(f"{path}: not a PyTorch zip checkpoint{hint}; files from torch < 1.6's legacy format "
                        f"are not read: re-save it with a newer torch ({type(exc).__name__})") from None
    pickles = [n for n in archive.namelist() if n.endswith("/data.pkl") and n.count("/") == 1]
    if len(pickles) != 1:
        raise UserError(f"{path}: a zip, but not one torch.save wrote (no <name>/data.pkl)")
    prefix = pickles[0][: -len("data.pkl")]
    order = prefix + "byteorder"
    if order in archive.namelist() and archive.read(order).strip() != b"little":
        raise UserError(f"{path}: saved on a big-endian machine; re-save it on a little-endian one")
    with archive.open(pickles[0]) as f:
        try:
            return _Unpickler(f, archive, prefix, path).load()
        except UserError:
            raise
        except Exception as exc:   # a damaged pickle
            raise UserError(f"{path}: its pickle cannot be read ({type(exc).__name__}: {str(exc)[:80]})") from None


def _starts_with(path: str, head: bytes) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(len(head)).lstrip().startswith(head)
    except OSError:
        return False


def module_state(module: Any, prefix: str = "") -> dict[str, Tensor]:
    """``state_dict()`` of a stand-in nn.Module tree, from its pickled _parameters / _buffers / _modules."""
    d = getattr(module, "__dict__", {})
    out: dict[str, Tensor] = {}
    skip = set(d.get("_non_persistent_buffers_set", ()) or ())
    for key in ("_parameters", "_buffers"):
        for name, value in (d.get(key) or {}).items():
            if value is not None and name not in skip:
                out[prefix + name] = value
    for name, child in (d.get("_modules") or {}).items():
        if child is not None:
            out.update(module_state(child, f"{prefix}{name}."))
    return out
