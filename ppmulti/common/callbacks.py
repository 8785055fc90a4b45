"""Users' training callbacks given by import path (``EVENT=module:function``): ultralytics' event names, the check
that a function can be imported again in every rank, and the spec the ranks read (pure Python, no paddle)."""

from __future__ import annotations

import importlib
import inspect
import os
import re
import sys
from dataclasses import dataclass
from typing import Any, Callable

from ppmulti.common.errors import UserError

# ultralytics' training events -> (the trainer's hook point, the order there): "early" runs before evaluation and
# checkpointing in after_epoch (ultralytics' on_train_epoch_end: "before validation"), "late" after them.
EVENTS: dict[str, tuple[str, str]] = {
    "on_pretrain_routine_end": ("before_train", "early"),
    "on_train_start": ("before_train", "late"),
    "on_train_epoch_start": ("before_epoch", "late"),
    "on_train_batch_start": ("before_step", "late"),
    "on_train_batch_end": ("after_step", "late"),
    "on_train_epoch_end": ("after_epoch", "early"),
    "on_fit_epoch_end": ("after_epoch", "late"),
    "on_model_save": ("after_epoch", "late"),
    "on_train_end": ("after_train", "late"),
    "teardown": ("close", "late"),
}
# ultralytics' events that have no moment here (its own docs call the first four reserved, not called by default)
NOT_CALLED = ("on_pretrain_routine_start", "optimizer_step", "on_before_zero_grad", "on_params_update")
_SPEC = re.compile(r"^(?P<event>\w+)=(?P<module>[\w.]+):(?P<qualname>[\w.]+)$")


@dataclass(frozen=True)
class CallbackSpec:
    event: str
    module: str
    qualname: str

    def __str__(self) -> str:
        return f"{self.event}={self.module}:{self.qualname}"


def check_event(event: str) -> str:
    if event in EVENTS:
        return event
    if event in NOT_CALLED:
        raise UserError(f"callback event {event}: ppmulti has no such moment (ultralytics reserves it); use one of "
                        f"{', '.join(EVENTS)}")
    raise UserError(f"callback event {event!r} is not a training event; use one of {', '.join(EVENTS)}")


def parse_spec(text: str) -> CallbackSpec:
    """``--callback on_fit_epoch_end=mymodule:log_metrics`` -> its spec, the function found and callable."""
    spec = spec_from_text(text)
    resolve(spec)
    return spec


def spec_from_text(text: str) -> CallbackSpec:
    """``--callback``'s text -> its spec, the form and the event checked (no import: ``resolve`` finds it)."""
    match = _SPEC.match(text.strip())
    if not match:
        raise UserError(f"--callback {text}: expected EVENT=MODULE:FUNCTION, e.g. "
                        f"on_fit_epoch_end=my_callbacks:log_metrics")
    return CallbackSpec(check_event(match["event"]), match["module"], match["qualname"])


def resolve(spec: CallbackSpec) -> Callable[..., Any]:
    """Import ``spec``'s function as each rank will (the working directory on the path, as ``python -m`` has it: a
    rank runs a script, whose own folder is first on its path); a missing module or name is one line."""
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.append(os.getcwd())
    try:
        obj: Any = importlib.import_module(spec.module)
    except ImportError as exc:
        raise UserError(f"callback {spec}: cannot import {spec.module} ({exc}); the module must be importable "
                        f"where training runs (on the Python path of every rank)") from None
    for part in spec.qualname.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            raise UserError(f"callback {spec}: {spec.module} has no {spec.qualname}")
    if not callable(obj):
        raise UserError(f"callback {spec}: {spec.module}.{spec.qualname} is not callable")
    return obj


def spec_of(event: str, func: Callable[..., Any]) -> CallbackSpec:
    """The import path of ``func``, or one line saying why the training ranks could not import it again (the
    callbacks ultralytics loses under DDP: a lambda, a function defined in a notebook cell or a script's
    __main__, a function nested in another)."""
    check_event(event)
    name = getattr(func, "__qualname__", None) or repr(func)
    module = getattr(func, "__module__", None)
    where = ("define it at the top level of a .py module (e.g. callbacks.py beside your notebook) and pass "
             "the function imported from there")
    if not inspect.isfunction(func) and not inspect.isbuiltin(func):
        raise UserError(f"callback {name} for {event}: only functions can run in every rank, not {type(func).__name__}"
                        f" objects; {where}")
    if func.__name__ == "<lambda>" or "<locals>" in name:
        raise UserError(f"callback {name} for {event}: a lambda or nested function cannot be imported by the "
                        f"training ranks; {where}")
    if module in (None, "__main__", "builtins"):
        raise UserError(f"callback {name} for {event} is defined in __main__ (a notebook or the running script), "
                        f"which the training ranks cannot import; {where}")
    spec = CallbackSpec(event, module, name)
    if resolve(spec) is not func:
        raise UserError(f"callback {name} for {event}: {module}.{name} is not this function (redefined since it "
                        f"was imported?); {where}")
    return spec
