"""The house's rules, read from the code: which side imports what, no import circles, one home for process starts."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "ppmulti"
HEAVY = ("paddle", "ppdet")                 # rank side only: never in common or on the process side
RANK_ENTRY = "ppmulti.rank.entry"           # the one rank-side module the process side may call


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _imports(name: str) -> list[tuple[str, bool]]:
    """(imported module, at module level?) for every import in the module, inside functions too."""
    tree = ast.parse(MODULES[name].read_text())
    top = {id(n) for n in tree.body}
    package = name if MODULES[name].name == "__init__.py" else name.rpartition(".")[0]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name, id(node) in top) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            for a in node.names:   # `from pkg import mod` imports pkg.mod when that is a module
                target = f"{base}.{a.name}"
                out.append((target if target in MODULES else base, id(node) in top))
    return out


def _side(name: str) -> str:
    if name.startswith("ppmulti.procs") or name in ("ppmulti.cli", "ppmulti"):   # the front doors: the command, and
        return "procs"                                                             # the package's API (YOLO)
    if name.startswith("ppmulti.rank"):
        return "rank"
    return "common"


def _heavy(target: str) -> bool:
    return target.split(".")[0] in HEAVY


def test_every_module_opens_with_a_one_line_docstring():
    missing = [n for n, p in MODULES.items() if not (ast.get_docstring(ast.parse(p.read_text())) or "").strip()]
    assert not missing, f"modules without a docstring saying what they own: {missing}"


def test_process_side_imports_no_paddle_and_no_rank_module():
    bad = [(n, t) for n in MODULES if _side(n) == "procs" for t, _ in _imports(n)
           if _heavy(t) or (t.startswith("ppmulti.rank") and t != RANK_ENTRY)]
    assert not bad, f"process-side imports of paddle/ppdet/rank-side modules (only {RANK_ENTRY} is allowed): {bad}"


def test_shared_leaves_import_neither_side():
    bad = [(n, t) for n in MODULES if _side(n) == "common" for t, _ in _imports(n)
           if t.startswith(("ppmulti.procs", "ppmulti.rank")) or _heavy(t)]
    assert not bad, f"shared modules importing a side, or paddle/ppdet (inside functions too): {bad}"


def test_rank_side_imports_no_process_side_module():
    bad = [(n, t) for n in MODULES if _side(n) == "rank" for t, _ in _imports(n) if t.startswith("ppmulti.procs")]
    assert not bad, f"rank-side imports of process-side modules: {bad}"


def test_rank_side_starts_no_process():
    starters = {"subprocess", "multiprocessing", "pty"}
    bad = []
    for n in (m for m in MODULES if _side(m) == "rank"):
        tree = ast.parse(MODULES[n].read_text())
        bad += [(n, t) for t, _ in _imports(n) if t.split(".")[0] in starters]
        bad += [(n, f"os.{node.attr}") for node in ast.walk(tree) if isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name) and node.value.id == "os"
                and (node.attr in ("fork", "forkpty", "system", "popen") or node.attr.startswith(("spawn", "exec")))]
    assert not bad, f"rank-side modules that start processes: {bad}"


def _cycles() -> list[list[str]]:
    graph = {n: sorted({t for t, _ in _imports(n) if t in MODULES and t != n}) for n in MODULES}
    # a package's __init__ is imported on the way to its modules; only real module edges count here
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):   # Tarjan's strongly connected components
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_no_import_circles():
    assert not _cycles(), f"modules that import each other (inside functions too): {_cycles()}"


@pytest.mark.parametrize("rule", ["procs", "common"])
def test_the_rules_catch_a_violation(rule, monkeypatch, tmp_path):
    """The checks above really read imports: a planted bad import is found."""
    fake = tmp_path / "bad.py"
    fake.write_text('"""Planted."""\n\n\ndef f():\n    import paddle  # noqa\n')
    name = "ppmulti.procs.planted" if rule == "procs" else "ppmulti.common.planted"
    monkeypatch.setitem(MODULES, name, fake)
    check = (test_process_side_imports_no_paddle_and_no_rank_module if rule == "procs"
             else test_shared_leaves_import_neither_side)
    with pytest.raises(AssertionError, match="planted"):
        check()


# --- the rank side's floors: a room (a module or package right under ppmulti/rank/) imports only lower floors ------
# Lowest first. A new room goes on the floor of what it needs; an import that would run back up means the function
# it wants belongs lower (pure helpers of the config and the -o items live in common/, below every floor).
RANK_FLOORS: tuple[tuple[str, frozenset[str]], ...] = (
    ("the version seam and small leaves, the run plan",
     frozenset({"compat", "heartbeat", "newer", "ranklog", "zoo", "tool_args", "plan"})),
    ("what registers into ppdet, and the rank's world", frozenset({"ops", "data", "models", "dist", "worker"})),
    ("the door into ppdet (registration, device)", frozenset({"ppdet_bridge"})),
    ("configs loaded", frozenset({"config"})),
    ("configs edited from flags", frozenset({"yolo_config", "ref_batch"})),
    ("the engine: trainer, hooks, plans, evaluation, export", frozenset({"engine"})),
    ("entry points", frozenset({"entry", "eval_setup"})),
    ("probes over the entry", frozenset({"bench_probe"})),
)


def _rank_room(name: str) -> str | None:
    parts = name.split(".")
    return parts[2] if len(parts) > 2 and parts[:2] == ["ppmulti", "rank"] else None


def _rank_floor(room: str) -> int | None:
    return next((i for i, (_, rooms) in enumerate(RANK_FLOORS) if room in rooms), None)


def _rank_upward() -> list[str]:
    """Imports (inside functions too) from one rank room to another on the same floor or higher."""
    bad = []
    for n in MODULES:
        room = _rank_room(n)
        if room is None:
            continue
        for t, _ in _imports(n):
            target = _rank_room(t) if t in MODULES else None
            if target is None or target == room:
                continue
            if _rank_floor(target) >= _rank_floor(room):
                bad.append(f"{n} -> {t} ({RANK_FLOORS[_rank_floor(room)][0]} -> "
                           f"{RANK_FLOORS[_rank_floor(target)][0]})")
    return bad


def test_every_rank_room_stands_on_a_floor():
    rooms = {r for n in MODULES for r in [_rank_room(n)] if r}
    unplaced = sorted(r for r in rooms if _rank_floor(r) is None)
    assert not unplaced, f"ppmulti/rank rooms on no floor (add them to RANK_FLOORS by what they import): {unplaced}"


def test_rank_side_imports_run_down_its_floors():
    bad = _rank_upward()
    assert not bad, f"rank-side imports that run back up (move the function to the floor it belongs to): {bad}"


def test_the_floors_rule_catches_an_import_back_up(monkeypatch, tmp_path):
    """A data module reaching up into the engine (inside a function), and one room importing another on its own
    floor, are both found."""
    fake = tmp_path / "bad.py"
    fake.write_text('"""Planted."""\n\n\ndef f():\n    from ppmulti.rank.engine import trainer  # noqa\n'
                    '    from ppmulti.rank import models  # noqa\n')
    monkeypatch.setitem(MODULES, "ppmulti.rank.data.planted", fake)
    with pytest.raises(AssertionError, match="planted") as err:
        test_rank_side_imports_run_down_its_floors()
    assert "ppmulti.rank.engine.trainer" in str(err.value) and "-> ppmulti.rank.models (" in str(err.value)


# --- one supervisor: every process start and every signal to another process goes through it ------------
SUPERVISOR = "ppmulti.procs.supervisor"
STARTS_OR_SIGNALS = {
    "subprocess": {"Popen", "run", "call", "check_call", "check_output", "getoutput", "getstatusoutput"},
    "os": {"fork", "forkpty", "kill", "killpg", "system", "popen", "posix_spawn", "posix_spawnp"},
}
# a rank re-raising SIGTERM on itself with the default action (so its parent sees "killed by SIGTERM"): it
# signals no other process, and the rank side may not import the supervisor
SELF_SIGNAL_ALLOWED = {"ppmulti.rank.worker"}


def _is_getpid(node: ast.AST) -> bool:
    return (isinstance(node, ast.Call) and not node.args and isinstance(node.func, ast.Attribute)
            and node.func.attr == "getpid" and isinstance(node.func.value, ast.Name) and node.func.value.id == "os")


def _starts_or_signals(name: str) -> list[str]:
    """`subprocess.Popen`, `os.kill`, ... in a module (aliases and `from ... import` included)."""
    tree = ast.parse(MODULES[name].read_text())
    aliases: dict[str, str] = {}                # local name -> module, for `import os as o`
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            aliases.update({a.asname or a.name: a.name for a in node.names if a.name in STARTS_OR_SIGNALS})
        elif isinstance(node, ast.ImportFrom) and node.module in STARTS_OR_SIGNALS and not node.level:
            found += [f"from {node.module} import {a.name}" for a in node.names
                      if a.name in STARTS_OR_SIGNALS[node.module] or a.name == "*"]
    excused = set()
    if name in SELF_SIGNAL_ALLOWED:
        excused = {id(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call) and n.args and _is_getpid(n.args[0])}
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases
                and node.attr in STARTS_OR_SIGNALS[aliases[node.value.id]] and id(node) not in excused):
            found.append(f"{aliases[node.value.id]}.{node.attr} (line {node.lineno})")
    return found


def test_only_the_supervisor_starts_or_signals_processes():
    bad = {n: f for n in MODULES if n != SUPERVISOR for f in [_starts_or_signals(n)] if f}
    assert not bad, f"process starts/signals outside {SUPERVISOR} (use its start/run/Child.signal/sweep): {bad}"


def test_the_supervisor_rule_catches_a_violation(monkeypatch, tmp_path):
    """A planted Popen, a liveness probe with os.kill, an aliased killpg and a self-signal outside the one
    excused module are all found; the excused module's self-signal is not."""
    fake = tmp_path / "bad.py"
    fake.write_text('"""Planted."""\n\nimport os\nimport subprocess as sp\nfrom os import killpg\n\n\n'
                    'def f(pid):\n    sp.Popen(["true"])\n    os.kill(pid, 0)\n    os.kill(os.getpid(), 15)\n')
    monkeypatch.setitem(MODULES, "ppmulti.procs.planted", fake)
    with pytest.raises(AssertionError, match="planted") as err:
        test_only_the_supervisor_starts_or_signals_processes()
    for needle in ("subprocess.Popen (line 9)", "os.kill (line 10)", "os.kill (line 11)", "from os import killpg"):
        assert needle in str(err.value)
    monkeypatch.setitem(MODULES, "ppmulti.procs.planted", MODULES["ppmulti.rank.worker"])
    assert _starts_or_signals("ppmulti.procs.planted")       # the self-signal is excused in rank.worker only
    assert not _starts_or_signals("ppmulti.rank.worker")
