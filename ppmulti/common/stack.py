"""The start-up stack check: Python, Paddle and ppdet's environment, read from package metadata (no paddle import)."""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import dataclass, field

from ppmulti.common.compat import installed_version
from ppmulti.common.errors import UserError

# The range CI tests (docs/stacks.md): versions as (major, minor), both ends included.
PYTHONS = ((3, 10), (3, 13))
PADDLES = ((2, 6), (3, 3))
DEFAULT_PADDLE = "3.3.1"   # setup.py's default on every Python
OPT_IN_PADDLE = "2.6.2"    # PPMULTI_PADDLE_VERSION=2.6.2 at install time, Python 3.10/3.11 only
OPT_IN_PYTHONS = ((3, 10), (3, 11))
# Both wheels install the same `paddle` module; with both present, the files of whichever came last win.
PADDLE_DISTS = ("paddlepaddle", "paddlepaddle-gpu")
PPDET_DIST = "paddledet"
INSTALL_HINT = "see docs/stacks.md"


@dataclass(frozen=True)
class Stack:
    """What the check looks at: the Python, the installed distributions it cares about, pkg_resources."""

    python: tuple[int, ...]
    dists: dict[str, tuple[int, ...]] = field(default_factory=dict)   # distribution name -> version
    has_pkg_resources: bool = True
    has_paddle_module: bool = False   # a `paddle` importable without a wheel's metadata (a source build on the path)


def _text(version: tuple[int, ...]) -> str:
    return ".".join(map(str, version))


def current_stack() -> Stack:
    """This interpreter's stack, from importlib.metadata and the import system only (nothing imported)."""
    names = (*PADDLE_DISTS, PPDET_DIST, "setuptools", "protobuf")
    dists = {n: v for n in names if (v := installed_version(n)) is not None}
    return Stack(python=tuple(sys.version_info[:3]), dists=dists,
                 has_pkg_resources=importlib.util.find_spec("pkg_resources") is not None,
                 has_paddle_module=importlib.util.find_spec("paddle") is not None)


def problem(stack: Stack, need_paddle: bool = True) -> str | None:
    """The first thing wrong with ``stack``, as one line naming the problem and its fix; None when fine.

    ``need_paddle=False`` (the ``ppmulti`` command, which also runs data tools and dry runs without Paddle)
    lets a missing Paddle or ppdet pass, but never a broken one.
    """
    py = _text(stack.python[:3])
    lo, hi = PYTHONS
    if not lo <= tuple(stack.python[:2]) <= hi:
        return (f"Python {py} is not supported: ppmulti is tested on Python {_text(lo)} to {_text(hi)}; "
                f"make a venv with one of those and install there ({INSTALL_HINT})")
    paddles = {n: stack.dists[n] for n in PADDLE_DISTS if n in stack.dists}
    if len(paddles) > 1:
        both = " and ".join(f"{n} {_text(v)}" for n, v in paddles.items())
        return (f"two Paddle distributions are installed ({both}) and both provide the `paddle` module: "
                f"run `pip uninstall -y {' '.join(paddles)}`, then install the one you want "
                f"(docs/stacks.md, 'GPU'; keep yours with PPMULTI_PADDLE=none)")
    if paddles:
        name, version = next(iter(paddles.items()))
        lo, hi = PADDLES
        if not lo <= tuple(version[:2]) <= hi:
            side = "older" if tuple(version[:2]) < lo else "newer"
            return (f"{name} {_text(version)} is {side} than ppmulti supports (Paddle {_text(lo)} to {_text(hi)}): "
                    f"install {name}=={DEFAULT_PADDLE} (or {OPT_IN_PADDLE} on Python 3.10/3.11) ({INSTALL_HINT})")
        if tuple(version[:2]) < (3,):
            found = _paddle2_problem(name, version, stack)
            if found:
                return found
    elif need_paddle and not stack.has_paddle_module:
        return (f"Paddle is not installed: pip install paddlepaddle=={DEFAULT_PADDLE} "
                f"(or {OPT_IN_PADDLE} on Python 3.10/3.11) ({INSTALL_HINT})")
    if PPDET_DIST in stack.dists:
        if not stack.has_pkg_resources:
            have = f"setuptools {_text(stack.dists['setuptools'])}" if "setuptools" in stack.dists else "no setuptools"
            return (f"ppdet needs pkg_resources, which {have} does not provide: "
                    f"pip install \"setuptools>=77.0.3,<81\"")
    elif need_paddle:
        return f"ppdet is not installed: pip install --no-deps paddledet==2.6.0 ({INSTALL_HINT})"
    return None


def _paddle2_problem(name: str, version: tuple[int, ...], stack: Stack) -> str | None:
    """What breaks Paddle 2.6 that setup.py's opt-in pins keep out, when something installed it anyway."""
    lo, hi = OPT_IN_PYTHONS
    if not lo <= tuple(stack.python[:2]) <= hi:
        return (f"{name} {_text(version)} is tested on Python 3.10 and 3.11 only, this is Python "
                f"{_text(stack.python[:3])}: pip install {name}=={DEFAULT_PADDLE} ({INSTALL_HINT})")
    protobuf = stack.dists.get("protobuf")
    if protobuf and protobuf[:1] >= (7,):
        return (f"protobuf {_text(protobuf)} breaks {name} {_text(version)}'s fleet.init (FieldDescriptor has no "
                f"'label'): pip install \"protobuf<7\" ({INSTALL_HINT})")
    return None


def check_stack(need_paddle: bool = True, stack: Stack | None = None) -> None:
    """Raise UserError (one line, exit 2) when this environment cannot run ppmulti; call before importing ppdet."""
    found = problem(stack or current_stack(), need_paddle=need_paddle)
    if found:
        raise UserError(found)
