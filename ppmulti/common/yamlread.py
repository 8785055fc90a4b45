"""ppdet YAML files read as plain data, without paddle: a ``_BASE_`` chain merged, ppdet's tags kept as values."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ppmulti.common.errors import UserError


def _yaml_loader() -> Any:
    import yaml

    class Loader(yaml.SafeLoader):
        """ppdet configs may carry tags of their own classes; they are read as plain data here."""

    def plain(loader: Any, _suffix: str, node: Any) -> Any:
        if isinstance(node, yaml.MappingNode):
            return loader.construct_mapping(node, deep=True)
        if isinstance(node, yaml.SequenceNode):
            return loader.construct_sequence(node, deep=True)
        return loader.construct_scalar(node)

    Loader.add_multi_constructor("!", plain)
    Loader.add_multi_constructor("tag:", plain)
    return Loader


def _merge(base: dict, top: dict) -> dict:
    out = dict(base)
    for key, value in top.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def load_config_chain(path: str | os.PathLike) -> tuple[dict, list[Path]]:
    """A ppdet YAML merged over its ``_BASE_`` files (relative to the including file), and the files read."""
    import yaml

    loader = _yaml_loader()
    files: list[Path] = []

    def load(p: Path, depth: int) -> dict:
        if depth > 20:
            raise UserError(f"{p}: _BASE_ files include each other in a loop")
        files.append(p)
        data = yaml.load(p.read_text(), Loader=loader) or {}
        if not isinstance(data, dict):
            raise UserError(f"{p}: not a YAML mapping")
        bases = data.pop("_BASE_", []) or []
        merged: dict = {}
        for base in [bases] if isinstance(bases, str) else bases:
            merged = _merge(merged, load(p.parent / str(base), depth + 1))
        return _merge(merged, data)

    return load(Path(path), 0), files


def reader_ops(cfg, name: str, reader: str = "TrainReader") -> list[dict]:
    """The bodies of every ``name`` op in a reader's sample and batch transforms (a bare ``- Op:`` gets an
    empty body, so the caller can edit it in place)."""
    ops = []
    for kind in ("sample_transforms", "batch_transforms"):
        for op in ((cfg or {}).get(reader) or {}).get(kind) or []:
            if isinstance(op, dict) and name in op:
                if op[name] is None:
                    op[name] = {}
                ops.append(op[name])
    return ops
