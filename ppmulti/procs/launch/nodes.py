"""``ppmulti launch --nodes``: the same launch on every node over ssh — preflight, fan-out, streamed output, stop.

How it runs. ``ppmulti launch --nodes A,B,C [FLAGS] SCRIPT ARGS`` turns into, for node i, the master-mode
launch ``ppmulti launch --nnodes 3 --node_rank i --master_addr A --master_port P [FLAGS] SCRIPT ARGS``
(``node_argv``, pure), so ppmulti's own rendezvous and its timeout apply as if the user had typed it on
every machine. Every node, the first one and this machine included, is reached through ssh with
``-o BatchMode=yes`` and the user's own ssh config and keys: one code path, and every node gets a login
environment of the same kind. The remote command is ``cd CWD && exec env PYTHONPATH=... PY -m
ppmulti.procs.launch.nodes --run TAG -- LAUNCH ARGV``, a small supervisor that runs the launch.

Stopping. Each node's processes carry ``PPMULTI_NODES_JOB=TAG`` (a per-node tag) in their environment,
which Paddle's launcher passes on to the ranks. The supervisor stops the launch when its stdin reaches
EOF, which is what ssh delivers when this side closes the session's stdin, or when the ssh client or this
process dies, however abruptly; it then SIGTERMs the launch (which stops Paddle's launcher and its ranks)
and finally SIGKILLs anything still carrying the tag (``kill_job`` reads ``/proc/*/environ``). On
Ctrl-C/SIGTERM, or when a node exits non-zero, this side closes every session's stdin, waits, and then runs
``--kill TAG`` on every node over a fresh ssh as a backstop. No tty is used: a tty hangup would reach only
the launcher, not Paddle's ranks, which run in sessions of their own.

Secret. The run's rendezvous token (this shell's ``PPMULTI_RDZV_TOKEN``, else a fresh random one) is the first
line this side writes on each session's stdin; the node's supervisor (``--run TAG --token-stdin``) reads it and
puts it in its launch's environment, so it is never on a command line (``ps``) or in the output.

Preflight. Before anything starts, every node runs ``--fingerprint`` (the same function here and there)
and prints one JSON line: ppmulti's version and a hash of its .py files, Python/Paddle/ppdet versions, the
script's hash, the ``-c`` config's hash with its ``_BASE_`` files, a manifest (file count, hash of relative
path and size) of each dataset directory the config or a ``--data`` yaml names, and whether the node's own
launch flags check out there. Unreachable nodes and every difference from node 0 are reported at once,
one line each, and nothing starts.

Output. Each node's lines are prefixed ``[node{i} ADDR]`` and written to ``LOG_DIR/nodes/node{i}.log``
here; node 0's also go to the console. Paddle's own worker logs on node i go to ``LOG_DIR/node{i}`` there,
so nodes sharing a file system (NFS home directories) do not overwrite each other's ``workerlog.N``.

Result. Each node's launch writes its ``LOG_DIR/node{i}/result.json`` there; once the fan-out has started, this
side writes ``LOG_DIR/result.json`` here (``result.combine``): the overall state and exit code, and per node its
state, exit code, restarts and duration, read from the node's own result.json when this machine sees it (the
same file system: loopback nodes, a shared home) and it was written by this run, else from the ssh exit status.
A preflight that refuses starts nothing and writes nothing.
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import json
import os
import posixpath
import shlex
import signal
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, TextIO

from ppmulti.common import envvars as E
from ppmulti.common import procfs as procs
from ppmulti.common.errors import UserError, first_line
from ppmulti.common.yamlread import load_config_chain
from ppmulti.procs import supervisor
from ppmulti.procs.launch.flags import FLAGS, build_parser, split_argv
from ppmulti.procs.launch.plan import DEFAULT_MASTER_PORT, check_master_port, check_port
from ppmulti.procs.launch.rendezvous import new_token
from ppmulti.procs.launch.result import RESULT_FILE, NodeEnd, combine, signal_name

DEFAULT_SSH_TIMEOUT = 10.0
DEFAULT_LOG_DIR = "log"                  # Paddle's own default for --log_dir
HANGUP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)   # Ctrl-C, kill, a closed terminal or session
REMOTE_GRACE = 10.0                      # seconds the node supervisor gives the launch after SIGTERM
FINGERPRINT_MARK = "PPMULTI-FINGERPRINT "
FINGERPRINT_BUDGET = 120.0               # seconds a node may spend hashing its files, beyond the ssh connect

# flags that only make sense with --nodes
NODES_ONLY = ("ssh_port", "ssh_identity", "ssh_config", "ssh_option", "ssh_timeout", "remote_cwd", "remote_python")
# flags --nodes decides for every node; the user may not give them too
REFUSED = (("node_rank", "--node_rank", "node ranks follow the order of --nodes"),
           ("ips", "--ips", "--nodes already lists the nodes"),
           ("host", "--host", "each node is addressed by its entry in --nodes"),
           ("master_addr", "--master_addr", "node 0 is the first of --nodes; put the address to use there first"),
           ("master", "--master", "node 0 is the first of --nodes; use --master_port for the port"),
           ("standalone", "--standalone", "--nodes runs several nodes"))
# flags consumed here and rewritten per node (everything else reaches every node unchanged)
CONSUMED = frozenset({"nodes", "nnodes", "master_port", "log_dir", "dry_run", *NODES_ONLY})
_FLAG_BY_NAME = {name: flag for flag in FLAGS for name in flag.spellings}


# --- the plan (pure) -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class SshOptions:
    """How to reach the nodes; anything else comes from the user's ssh config."""

    port: int | None = None
    identity: str | None = None
    config: str | None = None
    options: tuple[str, ...] = ()
    timeout: float = DEFAULT_SSH_TIMEOUT


@dataclass(frozen=True)
class NodesPlan:
    """One fan-out: the nodes, each node's ``ppmulti launch`` argv, and how to get there."""

    nodes: tuple[str, ...]                       # ssh destinations, node rank = position
    launch_argvs: tuple[tuple[str, ...], ...]    # per node: the argv after `ppmulti launch`
    master_addr: str
    master_port: int
    ssh: SshOptions
    remote_cwd: str
    remote_python: str
    remote_pythonpath: str | None                # None: ppmulti is installed on the nodes
    log_dir: str                                 # local: LOG_DIR/nodes/node{i}.log
    job: str
    dry_run: bool = False

    def __post_init__(self) -> None:
        assert len(self.nodes) == len(self.launch_argvs) and self.nodes, "one launch argv per node"

    def name(self, i: int) -> str:
        return f"node{i} {self.nodes[i]}"

    def tag(self, i: int) -> str:
        """Node i's job tag; per node, so nodes sharing one machine never clean up each other's processes."""
        return f"{self.job}-node{i}"

    def node_log(self, i: int) -> str:
        return os.path.join(self.log_dir, "nodes", f"node{i}.log")


def _flag_items(flags: list[str]) -> list[tuple[str, list[str]]]:
    """(dest, the tokens as typed) for each launch flag; ``split_argv`` has already vetted the names."""
    items, i = [], 0
    while i < len(flags):
        item = flags[i]
        flag = _FLAG_BY_NAME.get(item.split("=", 1)[0])
        if flag is None:
            raise UserError(f"unknown launch flag {item}; `ppmulti launch --help` lists them")
        n = 2 if flag.takes_value and "=" not in item else 1
        items.append((flag.dest, flags[i:i + n]))
        i += n
    return items


def _host_of(destination: str) -> str:
    """The address in an ssh destination ``[user@]host``."""
    return destination.rsplit("@", 1)[-1]


def node_argv(kept: list[str], script: str, script_args: list[str], nodes: tuple[str, ...], rank: int,
              master_port: int, log_dir: str) -> list[str]:
    """The ``ppmulti launch`` argv for node ``rank``: master mode, then the user's other flags unchanged.

    ``--host`` is the node's own entry: Paddle's HTTP master starts only on the node whose host equals the
    master address, and left to itself Paddle would take the address of the host name, which need not
    be the one in ``--nodes`` (several interfaces, or several loopback "nodes" on one machine).
    """
    return ["--nnodes", str(len(nodes)), "--node_rank", str(rank), "--master_addr", _host_of(nodes[0]),
            "--master_port", str(master_port), "--host", _host_of(nodes[rank]), "--log_dir", log_dir,
            *kept, script, *script_args]


def remote_pythonpath(package_root: str | None, cwd: str, remote_cwd: str) -> str | None:
    """Where ppmulti sits on the nodes: at the same place relative to the working directory when this
    machine runs it from a checkout around or inside the directory, else at the same absolute path."""
    if package_root is None:
        return None
    rel = os.path.relpath(package_root, cwd)
    parts = rel.split(os.sep)
    if rel == ".":
        return remote_cwd
    if all(p == ".." for p in parts) or ".." not in parts:
        return posixpath.normpath(posixpath.join(remote_cwd, *parts))
    return package_root


def _positive(value: str | None, flag: str, example: str) -> float | None:
    if value is None:
        return None
    try:
        number = float(value)
    except ValueError:
        number = -1.0
    if number <= 0:
        raise UserError(f"{flag} {value!r}: expected a positive number, e.g. {flag} {example}")
    return number


def plan_nodes(argv: list[str], cwd: str, python: str, package_root: str | None, job: str) -> NodesPlan:
    """Parse a ``ppmulti launch --nodes ...`` argv into a NodesPlan (pure: the caller supplies the machine)."""
    flags, script, script_args = split_argv(list(argv))
    ns = build_parser().parse_args(flags)
    if not script:
        raise UserError("no training script given: ppmulti launch --nodes A,B [FLAGS] SCRIPT.py [SCRIPT ARGS]")
    nodes = tuple(x.strip() for x in str(ns.nodes or "").split(",") if x.strip())
    if not nodes:
        raise UserError(f"--nodes {ns.nodes!r}: expected the nodes' addresses, e.g. --nodes 10.0.0.1,10.0.0.2")
    if len(set(nodes)) != len(nodes):
        raise UserError(f"--nodes {ns.nodes}: a node is listed twice")
    for dest, flag, why in REFUSED:
        if getattr(ns, dest):
            raise UserError(f"{flag} cannot be combined with --nodes ({why}); drop {flag}")
    if ns.nnodes is not None and str(ns.nnodes).strip() != str(len(nodes)):
        raise UserError(f"--nnodes {ns.nnodes} disagrees with --nodes {ns.nodes} ({len(nodes)} nodes); drop --nnodes")
    master_port = check_master_port(ns.master_port or DEFAULT_MASTER_PORT)
    ssh_port = None if ns.ssh_port is None else check_port(ns.ssh_port, "--ssh-port", "22")
    for option in ns.ssh_option or []:
        if "=" not in option and " " not in option:
            raise UserError(f"--ssh-option {option!r}: expected KEY=VALUE as for ssh -o, "
                            f"e.g. --ssh-option ConnectionAttempts=3")
    timeout = _positive(ns.ssh_timeout, "--ssh-timeout", "10") or DEFAULT_SSH_TIMEOUT

    kept = [tok for dest, tokens in _flag_items(flags) if dest not in CONSUMED for tok in tokens]
    log_dir = ns.log_dir or DEFAULT_LOG_DIR
    argvs = tuple(tuple(node_argv(kept, script, script_args, nodes, i, master_port,
                                  posixpath.join(log_dir, f"node{i}")))
                  for i in range(len(nodes)))
    remote_cwd = ns.remote_cwd or cwd
    return NodesPlan(
        nodes=nodes, launch_argvs=argvs, master_addr=_host_of(nodes[0]), master_port=master_port,
        ssh=SshOptions(port=ssh_port, identity=ns.ssh_identity, config=ns.ssh_config,
                       options=tuple(ns.ssh_option or ()), timeout=timeout),
        remote_cwd=remote_cwd, remote_python=ns.remote_python or python,
        remote_pythonpath=remote_pythonpath(package_root, cwd, remote_cwd), log_dir=log_dir, job=job,
        dry_run=bool(ns.dry_run))


def _shell_path(path: str) -> str:
    """A path for a POSIX shell, quoted, with a leading ``~/`` left to the remote shell to expand."""
    if path == "~" or path == "~/":
        return "~/"
    if path.startswith("~/"):
        return "~/" + shlex.quote(path[2:])     # the slash unquoted, or the shell does not expand the tilde
    return shlex.quote(path)


def remote_command(plan: NodesPlan, words: Iterable[str]) -> str:
    """The shell command a node runs: ``python -m ppmulti.procs.launch.nodes WORDS`` in the remote directory.

    ``exec env`` rather than shell assignments: it reads the same in sh, bash, zsh, fish and csh.
    """
    env = [f"{E.PYTHONUNBUFFERED}=1"]
    if plan.remote_pythonpath:
        env.insert(0, f"{E.PYTHONPATH}={plan.remote_pythonpath}")
    parts = ["cd", _shell_path(plan.remote_cwd), "&&", "exec", "env", *map(shlex.quote, env),
             _shell_path(plan.remote_python), "-m", "ppmulti.procs.launch.nodes", *map(shlex.quote, words)]
    return " ".join(parts)


def ssh_argv(plan: NodesPlan, i: int, remote: str, keepalive: bool = False) -> list[str]:
    """The local ssh command that runs ``remote`` on node i.

    ssh keeps the first value it sees for an option, so BatchMode comes first (never a password prompt)
    and the user's ``--ssh-option`` values come before ppmulti's keep-alive defaults.
    """
    ssh = plan.ssh
    argv = ["ssh", "-o", "BatchMode=yes", "-o", f"ConnectTimeout={max(1, round(ssh.timeout))}"]
    if ssh.config:
        argv += ["-F", ssh.config]
    if ssh.identity:
        argv += ["-i", ssh.identity]
    if ssh.port:
        argv += ["-p", str(ssh.port)]
    for option in ssh.options:
        argv += ["-o", option]
    if keepalive:
        # a node that vanishes (power, network) ends its session within a minute: then the others stop
        argv += ["-o", "ServerAliveInterval=15", "-o", "ServerAliveCountMax=4"]
    return [*argv, "-T", plan.nodes[i], remote]


def node_commands(plan: NodesPlan) -> list[list[str]]:
    """Per node, the ssh command that runs its launch under the supervisor (which reads the run's rendezvous
    token from the first line of its stdin: never on a command line)."""
    return [ssh_argv(plan, i, remote_command(plan, ["--run", plan.tag(i), "--token-stdin", "--",
                                                    *plan.launch_argvs[i]]),
                     keepalive=True)
            for i in range(len(plan.nodes))]


def describe(plan: NodesPlan) -> str:
    """What ``--nodes ... --dry-run`` prints: one ssh command per node."""
    lines = []
    for i, argv in enumerate(node_commands(plan)):
        lines += [f"# {plan.name(i)}", shlex.join(argv)]
    return "\n".join(lines) + "\n"


# --- the fingerprint (runs on every node) ----------------------------------------------------------------
def code_hash(package_dir: str | os.PathLike) -> str:
    """sha256 of (relative path, content) of every .py file of a package, in sorted order."""
    root = Path(package_dir)
    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*.py") if "__pycache__" not in p.parts):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()


def dir_manifest(path: str | os.PathLike) -> tuple[int, str]:
    """(file count, sha256 of the sorted (relative path, size) list) of a directory tree."""
    root = str(path)
    entries = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in filenames:
            full = os.path.join(dirpath, name)
            try:
                size = os.stat(full).st_size
            except OSError:
                continue  # a dangling link is not data
            entries.append((os.path.relpath(full, root).replace(os.sep, "/"), size))
    entries.sort()
    digest = hashlib.sha256()
    for rel, size in entries:
        digest.update(f"{rel}\0{size}\n".encode())
    return len(entries), digest.hexdigest()


def script_data_args(script_args: list[str]) -> tuple[str | None, list[str], str | None]:
    """(``-c`` config, ``-o`` KEY=VALUE overrides, ``--data`` yaml) from a training script's arguments."""
    config, data, overrides = None, None, []
    i = 0
    while i < len(script_args):
        arg = script_args[i]
        name, eq, value = arg.partition("=")
        if name in ("-c", "--config", "--data") and not eq and i + 1 < len(script_args):
            value, i = script_args[i + 1], i + 1
        if name in ("-c", "--config") and (eq or value):
            config = value
        elif name == "--data" and (eq or value):
            data = value
        elif arg in ("-o", "--opt"):
            while i + 1 < len(script_args) and not script_args[i + 1].startswith("-"):
                overrides.append(script_args[i + 1])
                i += 1
        i += 1
    return config, overrides, data


DATASET_KEYS = ("TrainDataset", "EvalDataset")


def dataset_dirs(config: dict | None, overrides: list[str], data_yaml: dict | None) -> list[tuple[str, str]]:
    """(name, directory) per dataset the run reads: the config's dataset_dir (after ``-o``) or a data yaml's path."""
    found: dict[str, str] = {}
    for key in DATASET_KEYS:
        section = (config or {}).get(key)
        if isinstance(section, dict) and section.get("dataset_dir"):
            found[f"{key}.dataset_dir"] = str(section["dataset_dir"])
    for item in overrides:
        key, _, value = item.partition("=")
        if key.strip() in {f"{k}.dataset_dir" for k in DATASET_KEYS}:
            found[key.strip()] = value.strip()
    if data_yaml and data_yaml.get("path"):
        found["--data path"] = str(data_yaml["path"])
    return sorted(found.items())


def _dist_version(*names: str) -> str | None:
    from importlib import metadata

    for name in names:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def _file_sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def fingerprint(launch_argv: list[str], cwd: str | None = None) -> dict:
    """What must agree across nodes, as seen on this node for its own launch argv (no paddle import)."""
    from ppmulti.common.paths import PACKAGE
    from ppmulti.common.version import __version__
    from ppmulti.procs.launch.flags import build_plan, parse_launch_args
    from ppmulti.procs.launch.runner import local_addresses, visible_gpu_count

    base = Path(cwd or os.getcwd())
    errors: list[str] = []
    fp: dict[str, Any] = {
        "ppmulti": __version__, "code": code_hash(PACKAGE),
        "python": "%d.%d" % sys.version_info[:2], "paddle": _dist_version("paddlepaddle", "paddlepaddle-gpu"),
        "ppdet": _dist_version("paddledet"), "script": None, "config": None, "datasets": {}, "errors": errors}
    _, script, script_args = split_argv(list(launch_argv))
    try:
        build_plan(parse_launch_args(list(launch_argv)), os.environ, local_addresses(), visible_gpu_count(os.environ))
    except UserError as exc:
        errors.append(f"its launch flags are refused there: {exc}")
    if script:
        path = base / script
        if path.is_file():
            fp["script"] = _file_sha(path)
        else:
            errors.append(f"script {script} not found in {base}")
    config_path, overrides, data_path = script_data_args(script_args)
    config = data = None
    if config_path:
        try:
            config, files = load_config_chain(base / config_path)
            digest = hashlib.sha256()
            for f in files:
                digest.update(_file_sha(f).encode())
            fp["config"] = digest.hexdigest()
        except OSError as exc:
            errors.append(f"config {config_path}: {exc.strerror or exc}: {exc.filename or config_path}")
        except Exception as exc:  # YAML errors of any kind: reported, not raised, so every node is heard
            errors.append(f"config {config_path}: cannot be read ({type(exc).__name__}: {first_line(exc)})")
    if data_path:
        try:
            data, _ = load_config_chain(base / data_path)
            if data.get("path") and not (base / str(data["path"])).exists():
                data["path"] = str((base / data_path).parent / str(data["path"]))   # relative to the yaml
        except Exception as exc:
            errors.append(f"--data {data_path}: cannot be read ({type(exc).__name__})")
    for key, directory in dataset_dirs(config, overrides, data):
        path = base / directory
        if not path.is_dir():
            errors.append(f"{key} {directory}: no such directory in {base}")
            continue
        count, digest = dir_manifest(path)
        fp["datasets"][key] = {"dir": directory, "files": count, "sha": digest}
    return fp


# what compare() checks, with the words for its message and the fix
_FIELDS = (("ppmulti", "ppmulti version", "install the same ppmulti on every node"),
           ("code", "ppmulti code (hash of its .py files)", "use the same ppmulti checkout on every node"),
           ("python", "Python version", "use the same Python (--remote-python)"),
           ("paddle", "paddlepaddle version", "install the same Paddle on every node"),
           ("ppdet", "paddledet version", "install the same paddledet on every node"),
           ("script", "training script (sha256)", "copy the same script to every node"),
           ("config", "config with its _BASE_ files (sha256)", "copy the same configs to every node"))


def _short(value: Any) -> str:
    if value is None:
        return "none"
    text = str(value)
    return text[:12] if len(text) == 64 else text


def compare(plan_names: list[str], fingerprints: list[dict | None]) -> list[str]:
    """One line per problem: each node's own errors, then each difference from the first node heard."""
    problems: list[str] = []
    for name, fp in zip(plan_names, fingerprints):
        for error in (fp or {}).get("errors", []):
            problems.append(f"{name}: {error}")
    heard = [(n, fp) for n, fp in zip(plan_names, fingerprints) if fp is not None]
    if not heard:
        return problems
    ref_name, ref = heard[0]
    for name, fp in heard[1:]:
        for key, label, fix in _FIELDS:
            if fp.get(key) != ref.get(key):
                problems.append(f"{name}: {label} differs from {ref_name}'s: {_short(fp.get(key))} vs "
                                f"{_short(ref.get(key))}; {fix}")
        mine, theirs = fp.get("datasets", {}), ref.get("datasets", {})
        for key in sorted(set(mine) & set(theirs)):
            a, b = mine[key], theirs[key]
            if (a["files"], a["sha"]) != (b["files"], b["sha"]):
                problems.append(f"{name}: dataset {key} {a['dir']} differs from {ref_name}'s: {a['files']} files "
                                f"(manifest {_short(a['sha'])}) vs {b['files']} files (manifest {_short(b['sha'])}); "
                                f"sync the dataset to every node")
    return problems


# --- this side: preflight, start, supervise, stop -----------------------------------------------------
def _log(msg: str, out: TextIO | None = None) -> None:
    print(f"ppmulti launch: {msg}", file=out or sys.stderr, flush=True)


def _ssh_run(plan: NodesPlan, i: int, words: list[str], timeout: float) -> tuple[int | None, str, str]:
    """Run ``python -m ppmulti.procs.launch.nodes WORDS`` on node i; (exit code or None on timeout, stdout, stderr)."""
    argv = ssh_argv(plan, i, remote_command(plan, words))
    try:
        ran = supervisor.run(argv, timeout)
    except FileNotFoundError:
        raise UserError("--nodes needs the ssh client (`ssh`) on this machine; install openssh-client") from None
    return ran.code, ran.stdout, ran.stderr


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1] if lines else ""


def _fingerprint_of(plan: NodesPlan, i: int) -> tuple[dict | None, str | None]:
    budget = plan.ssh.timeout + FINGERPRINT_BUDGET
    code, out, err = _ssh_run(plan, i, ["--fingerprint", "--", *plan.launch_argvs[i]], budget)
    for line in out.splitlines():
        if line.startswith(FINGERPRINT_MARK):
            try:
                return json.loads(line[len(FINGERPRINT_MARK):]), None
            except ValueError:
                break
    if code is None:
        return None, f"no answer within {budget:g}s (ssh connected? hashing a huge dataset?)"
    detail = _last_line(err) or _last_line(out) or f"exit code {code}"
    if code == 255:
        return None, (f"not reachable by ssh (BatchMode, {plan.ssh.timeout:g}s): {detail}; check the address, "
                      f"your ssh keys/config (--ssh-config, --ssh-identity, --ssh-port)")
    return None, (f"the preflight did not run there (exit {code}): {detail}; check that {plan.remote_cwd} exists "
                  f"(--remote-cwd), that {plan.remote_python} is there (--remote-python) and can import ppmulti")


def preflight(plan: NodesPlan) -> list[str]:
    """Every node's fingerprint, in parallel; the problems, one line each (empty: all nodes agree)."""
    names = [plan.name(i) for i in range(len(plan.nodes))]
    with ThreadPoolExecutor(max_workers=min(32, len(plan.nodes))) as pool:
        results = list(pool.map(lambda i: _fingerprint_of(plan, i), range(len(plan.nodes))))
    problems = [f"{names[i]}: {why}" for i, (_, why) in enumerate(results) if why]
    return problems + compare(names, [fp for fp, _ in results])


class _Node:
    """One node's ssh session: its process, and a thread that prefixes and writes its lines."""

    def __init__(self, plan: NodesPlan, i: int, argv: list[str], console: TextIO | None, lock: threading.Lock,
                 token: str):
        self.i, self.name = i, plan.name(i)
        self.started_at, self.started = time.time(), time.monotonic()
        self.ended: float | None = None    # when this side first saw the session end
        self.stopped = False               # this side stopped it (another node failed, or a signal)
        self.log_path = plan.node_log(i)
        os.makedirs(os.path.dirname(self.log_path), exist_ok=True)
        self.log = open(self.log_path, "w", encoding="utf-8")
        self.tail: collections.deque[str] = collections.deque(maxlen=15)
        # its own session: a Ctrl-C on the terminal reaches only ppmulti, which then stops the nodes in order
        self.proc = supervisor.start(argv, stdin=supervisor.PIPE, stdout=supervisor.PIPE, stderr=supervisor.STDOUT)
        try:   # the run's rendezvous token, the first line the node's supervisor reads (supervise)
            assert self.proc.stdin is not None
            self.proc.stdin.write(token.encode() + b"\n")
            self.proc.stdin.flush()
        except OSError:
            pass   # ssh already gone: the session's exit code tells
        self.thread = threading.Thread(target=self._pump, args=(console, lock), daemon=True)
        self.thread.start()

    def _pump(self, console: TextIO | None, lock: threading.Lock) -> None:
        prefix = f"[{self.name}] "
        assert self.proc.stdout is not None
        for raw in iter(self.proc.stdout.readline, b""):
            line = prefix + raw.decode("utf-8", errors="replace").rstrip("\r\n")
            self.tail.append(line)
            self.log.write(line + "\n")
            self.log.flush()
            if console is not None:
                with lock:
                    print(line, file=console, flush=True)

    def poll(self) -> int | None:
        """The session's exit status (None: running), noting when it ended."""
        code = self.proc.poll()
        if code is not None and self.ended is None:
            self.ended = time.monotonic()
        return code

    def end(self, plan: NodesPlan) -> NodeEnd:
        """How the session ended, with the node's own result.json when it can be read here."""
        code = self.poll()
        return NodeEnd(self.name, code, (self.ended or time.monotonic()) - self.started, self.stopped,
                       node_result(plan, self.i, self.started_at))

    def hang_up(self) -> None:
        """Close the session's stdin: the node's supervisor sees EOF and stops its launch."""
        try:
            if self.proc.stdin and not self.proc.stdin.closed:
                self.proc.stdin.close()
        except OSError:
            pass

    def finish(self) -> None:
        self.thread.join(timeout=5)
        self.log.close()


def _stop_nodes(plan: NodesPlan, nodes: list[_Node], out: TextIO) -> None:
    """Hang up every session, give the nodes REMOTE_GRACE to stop, then sweep each node by its tag."""
    for node in nodes:
        node.stopped = node.stopped or node.poll() is None
        node.hang_up()
    deadline = time.monotonic() + REMOTE_GRACE + 5
    for node in nodes:
        node.proc.wait(max(0.1, deadline - time.monotonic()))
        node.poll()

    def sweep(i: int) -> tuple[int | None, str, str]:
        return _ssh_run(plan, i, ["--kill", plan.tag(i)], plan.ssh.timeout + 15)

    with ThreadPoolExecutor(max_workers=min(32, len(nodes))) as pool:
        for node, (code, _, err) in zip(nodes, pool.map(sweep, [n.i for n in nodes])):
            if code != 0:
                _log(f"{node.name}: could not check that its processes are gone ({_last_line(err) or code}); "
                     f"look for processes with {E.PPMULTI_NODES_JOB}={plan.tag(node.i)} there", out)
    for node in nodes:
        if node.proc.poll() is None:
            node.proc.signal(signal.SIGKILL)
            node.proc.wait()


def run_nodes(plan: NodesPlan, console: TextIO | None = None, out: TextIO | None = None) -> int:
    """Preflight every node, start them all, stream their output, stop them all on a failure or a signal."""
    console, out = console or sys.stdout, out or sys.stderr
    started = time.monotonic()
    _log(f"preflight of {len(plan.nodes)} node(s): {', '.join(plan.nodes)}", out)
    problems = preflight(plan)
    if problems:
        for problem in problems:
            print(f"error: preflight: {problem}", file=out, flush=True)
        _log(f"nothing started: {len(problems)} problem(s) found before the launch", out)
        return 1

    stop = threading.Event()
    nodes: list[_Node] = []
    try:
        with supervisor.forward_signals(lambda _signum: stop.set(), HANGUP_SIGNALS) as caught:
            return _fan_out(plan, nodes, stop, caught, console, out, started)
    finally:
        for node in nodes:
            if node.proc.poll() is None:  # only on an unexpected error above: do not leave sessions behind
                node.hang_up()
                node.proc.signal(signal.SIGKILL)


def _fan_out(plan: NodesPlan, nodes: list[_Node], stop: threading.Event, caught: list[int], console: TextIO,
             out: TextIO, started: float) -> int:
    """Start every node (into ``nodes``), wait for all to finish, one to fail, or a signal; stop them all then;
    write the combined ``LOG_DIR/result.json``."""
    lock = threading.Lock()
    # one secret for the whole run: the user's, else a fresh one; every node proves it knows it in the rendezvous
    token = (os.environ.get(E.PPMULTI_RDZV_TOKEN) or "").strip() or new_token()
    _log(f"job {plan.job}: starting {len(plan.nodes)} node(s), master {plan.master_addr}:{plan.master_port}", out)
    for i, argv in enumerate(node_commands(plan)):
        nodes.append(_Node(plan, i, argv, console if i == 0 else None, lock, token))
        if i > 0:
            _log(f"{plan.name(i)}: output in {plan.node_log(i)}", out)
    failed: _Node | None = None
    while not stop.is_set():
        codes = [n.poll() for n in nodes]
        failed = next((n for n, c in zip(nodes, codes) if c not in (None, 0)), None)
        if failed or all(c == 0 for c in codes):
            break
        stop.wait(0.2)
    if failed is None and not caught:
        for node in nodes:
            node.finish()
        _log(f"all {len(nodes)} node(s) finished", out)
        _keep_result(plan, nodes, 0, started, None, None, out)
        return 0
    if failed is not None:
        code = failed.proc.returncode
        what = "lost its ssh connection (ssh exit 255)" if code == 255 else f"exited with code {code}"
        print(f"error: {failed.name} {what}; stopping the other nodes (its output: {failed.log_path})",
              file=out, flush=True)
        if failed.i != 0:
            failed.thread.join(timeout=2)
            for line in failed.tail:
                print(line, file=out)
    else:
        _log(f"{signal.Signals(caught[0]).name}: stopping every node", out)
    _stop_nodes(plan, nodes, out)
    for node in nodes:
        node.finish()
    if failed is not None:
        code = failed.proc.returncode if 0 < failed.proc.returncode < 256 else 1
    else:
        code = 128 + caught[0]
    _keep_result(plan, nodes, code, started, None if failed is None else failed.i,
                 None if failed is not None else signal_name(caught[0]), out)
    return code


def node_result(plan: NodesPlan, i: int, since: float) -> dict | None:
    """Node i's own result.json as this machine sees it (its launch's log directory under --remote-cwd), when it
    was written since ``since`` (a file of an earlier run is not this run's); None when it cannot be read here."""
    path = os.path.join(os.path.expanduser(plan.remote_cwd), plan.log_dir, f"node{i}", RESULT_FILE)
    try:
        if os.stat(path).st_mtime < since:
            return None
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _keep_result(plan: NodesPlan, nodes: list[_Node], code: int, started: float, failed: int | None,
                 signame: str | None, out: TextIO) -> None:
    """The combined result in this side's log directory; a directory that cannot be written is said, not fatal."""
    result = combine([n.end(plan) for n in nodes], code, time.monotonic() - started, failed, signame, plan.job)
    try:
        result.write(plan.log_dir)
    except OSError as exc:
        _log(f"could not write {os.path.join(plan.log_dir, RESULT_FILE)}: {exc.strerror or exc}", out)


def package_root() -> str | None:
    """The checkout this ppmulti runs from (a directory with setup.py/pyproject.toml), or None when installed."""
    root = Path(__file__).resolve().parents[3]
    return str(root) if (root / "setup.py").is_file() or (root / "pyproject.toml").is_file() else None


def check_nodes_only_flags(ns: argparse.Namespace) -> None:
    """The ssh and remote flags are an error without --nodes (they would silently do nothing)."""
    for dest in NODES_ONLY:
        if getattr(ns, dest, None):
            flag = "--" + dest.replace("_", "-")
            raise UserError(f"{flag} only applies to ssh fan-out: add --nodes HOST,HOST or drop {flag}")


def launch_nodes(argv: list[str]) -> int:
    """``ppmulti launch --nodes ...``: plan, then print (``--dry-run``) or run."""
    job = f"ppm{os.getpid()}-{uuid.uuid4().hex[:8]}"
    plan = plan_nodes(argv, os.getcwd(), sys.executable, package_root(), job)
    if plan.dry_run:
        sys.stdout.write(describe(plan))
        return 0
    return run_nodes(plan)


# --- on each node: the supervisor and the sweep --------------------------------------------------------
def _run_mark(tag: str) -> bytes:
    """A supervisor's own command line holds ``--run TAG``: found by it even before its environment is readable."""
    return b"--run\0" + tag.encode() + b"\0"


def job_pids(tag: str) -> list[int]:
    """Processes of this user carrying the job tag: in their environment, or a supervisor's ``--run TAG``."""
    return procs.tagged(E.PPMULTI_NODES_JOB, tag, cmdline_mark=_run_mark(tag))


def kill_job(tag: str, grace: float = 3.0) -> int:
    """SIGTERM every process with the tag, SIGKILL what is left after ``grace``; the number left alive."""
    return len(supervisor.sweep(E.PPMULTI_NODES_JOB, tag, grace=grace, cmdline_mark=_run_mark(tag)).left)


def _read_token() -> str | None:
    """The first line of stdin (the run's rendezvous token), read byte by byte so nothing after it is consumed;
    None at EOF (this side hung up before sending it)."""
    data = b""
    while not data.endswith(b"\n"):
        try:
            chunk = os.read(0, 1)
        except OSError:
            return None
        if not chunk or len(data) > 4096:
            return None
        data += chunk
    return data.decode(errors="replace").strip()


def supervise(tag: str, launch_argv: list[str], grace: float = REMOTE_GRACE, token_stdin: bool = False) -> int:
    """Run ``ppmulti launch LAUNCH_ARGV`` tagged; stop it on EOF on stdin or a signal; leave nothing behind.
    ``token_stdin``: the first line of stdin is the run's rendezvous token, given to the launch's environment."""
    env = dict(os.environ)
    if token_stdin:
        token = _read_token()
        if token is None:
            print("ppmulti launch: the launching side hung up before the run started", file=sys.stderr, flush=True)
            return 1
        if token:
            env[E.PPMULTI_RDZV_TOKEN] = token
    env[E.PPMULTI_NODES_JOB] = tag
    env[E.PYTHONUNBUFFERED] = "1"
    stop = threading.Event()

    def watch_stdin() -> None:
        try:
            while os.read(0, 4096):
                pass
        except OSError:
            pass
        stop.set()

    with supervisor.forward_signals(lambda _signum: stop.set(), HANGUP_SIGNALS):
        child = supervisor.start([sys.executable, "-m", "ppmulti.procs.launch.command", *launch_argv], env=env,
                                 stdin=supervisor.DEVNULL, stderr=supervisor.STDOUT)
        threading.Thread(target=watch_stdin, daemon=True).start()
        while child.poll() is None and not stop.is_set():
            stop.wait(0.2)
        if child.poll() is None:
            print(f"ppmulti launch: node stopping ({tag})", file=sys.stderr, flush=True)
        # SIGTERM reaches the runner, which forwards it to Paddle's launcher, which stops the ranks; the sweep
        # then finds what ran in sessions of its own
        left = supervisor.stop_tree(child, grace, E.PPMULTI_NODES_JOB, tag, cmdline_mark=_run_mark(tag)).left
    if left:
        print(f"ppmulti launch: {len(left)} process(es) tagged {tag} survived SIGKILL", file=sys.stderr, flush=True)
    return procs.exit_code(child.returncode)


def main(argv: list[str] | None = None) -> int:
    """``python -m ppmulti.procs.launch.nodes --fingerprint|--run TAG|--kill TAG -- ...``: what runs on each node."""
    args = list(sys.argv[1:] if argv is None else argv)
    rest: list[str] = []
    if "--" in args:
        at = args.index("--")
        args, rest = args[:at], args[at + 1:]
    parser = argparse.ArgumentParser(prog="python -m ppmulti.procs.launch.nodes",
                                     description="the node side of `ppmulti launch --nodes` (not for direct use)")
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--fingerprint", action="store_true", help="print this node's fingerprint for -- LAUNCH ARGV")
    group.add_argument("--run", metavar="TAG", help="run `ppmulti launch -- LAUNCH ARGV` as job TAG")
    group.add_argument("--kill", metavar="TAG", help="stop every process of job TAG")
    parser.add_argument("--token-stdin", action="store_true",
                        help="with --run: read the run's rendezvous token from the first line of stdin")
    ns = parser.parse_args(args)
    if ns.fingerprint:
        print(FINGERPRINT_MARK + json.dumps(fingerprint(rest)), flush=True)
        return 0
    if ns.run:
        return supervise(ns.run, rest, token_stdin=ns.token_stdin)
    left = kill_job(ns.kill)
    return 0 if left == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
