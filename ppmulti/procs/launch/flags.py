"""Pure flag mapping: torchrun's and fleetrun's launch flags -> LaunchPlan -> Paddle 2.6 launcher argv + env."""

from __future__ import annotations

import argparse
import ipaddress
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from ppmulti.common import envvars as E
from ppmulti.common.errors import UserError
from ppmulti.common.paths import WORKER_SCRIPT
from ppmulti.procs.launch.plan import DEFAULT_MASTER_PORT, DEFAULT_RDZV_TIMEOUT, DEFAULT_START_PORT, LaunchPlan

# Paddle's launcher runs a training script as `python -u SCRIPT ARGS` only when SCRIPT ends in .py
# (controllers/controller.py _get_entrypoint), so the worker shim is passed by its file path.
WORKER_PATH = str(WORKER_SCRIPT)


@dataclass(frozen=True)
class Flag:
    names: tuple[str, ...]
    dest: str
    help: str
    takes_value: bool = True
    metavar: str | None = None
    repeat: bool = False      # may be given several times; the values are kept in order


FLAGS: tuple[Flag, ...] = (
    Flag(("--nproc_per_node", "--nproc-per-node"), "nproc_per_node",
         "processes (ranks) on this node, e.g. 2; 'gpu' or 'auto' = one per visible GPU. On a machine without "
         "GPUs (or with --device cpu) the ranks run on the CPU with gloo", metavar="N"),
    Flag(("--nnodes",), "nnodes", "number of nodes (machines), e.g. 2 (default 1)", metavar="N"),
    Flag(("--node_rank", "--node-rank"), "node_rank",
         "this node's rank, 0 .. nnodes-1, e.g. 1; node 0 runs at --master_addr", metavar="R"),
    Flag(("--master_addr", "--master-addr"), "master_addr",
         "address of node 0, e.g. 10.0.0.1 (needed with --nnodes > 1)", metavar="ADDR"),
    Flag(("--master_port", "--master-port"), "master_port",
         f"port on node 0, e.g. 29500 (default {DEFAULT_MASTER_PORT} for several nodes, a free one for one node); "
         f"ppmulti's rendezvous and rank 0's store use it, Paddle's HTTP rendezvous the next one", metavar="PORT"),
    Flag(("--master",), "master", "Paddle's spelling of --master_addr/--master_port, e.g. 10.0.0.1:29500",
         metavar="ADDR:PORT"),
    Flag(("--standalone",), "standalone", "one node on its own (the same as --nnodes 1)", takes_value=False),
    Flag(("--max_restarts", "--max-restarts"), "max_restarts",
         "restart every rank up to N times when one fails, e.g. 3 (default 0); ppmulti restarts the launch "
         "itself (Paddle 2.6 restarts only under etcd) and ppmulti's training resumes from its last checkpoint",
         metavar="N"),
    Flag(("--gpus",), "gpus", "GPU ids, one rank each, e.g. 0,1,2,3 (fleetrun)", metavar="IDS"),
    Flag(("--selected_gpus", "--selected-gpus", "--selected_gpu"), "selected_gpus",
         "the legacy fleetrun spelling of --gpus, e.g. 0,1; runs on Paddle's new launcher", metavar="IDS"),
    Flag(("--devices",), "devices", "Paddle's spelling of --gpus, e.g. 0,1", metavar="IDS"),
    Flag(("--device",), "device", "cpu or gpu (default: gpu when GPUs are visible, else cpu)", metavar="KIND"),
    Flag(("--ips",), "ips", "every node's address, fleetrun style, e.g. 10.0.0.1,10.0.0.2; node rank = position",
         metavar="IP,IP"),
    Flag(("--host",), "host", "this node's address in --ips (or for Paddle's endpoints), e.g. 10.0.0.2",
         metavar="IP"),
    Flag(("--log_dir", "--log-dir"), "log_dir", "directory for Paddle's workerlog.N files, e.g. log (default ./log)",
         metavar="DIR"),
    Flag(("--start_port", "--start-port"), "start_port",
         f"first worker port under --ips, e.g. 17000 (default: FLAGS_START_PORT, else {DEFAULT_START_PORT}); "
         f"ppmulti's rendezvous uses the port just below", metavar="PORT"),
    Flag(("--job_id", "--job-id"), "job_id", "job name (Paddle's log file names), e.g. yolo_run1", metavar="NAME"),
    Flag(("--rdzv-timeout", "--rdzv_timeout"), "rdzv_timeout",
         f"seconds to wait for missing nodes before giving up, e.g. 60 (default {DEFAULT_RDZV_TIMEOUT:g})",
         metavar="SECONDS"),
    Flag(("--dry-run", "--dry_run"), "dry_run", "print the Paddle command and environment changes; run nothing",
         takes_value=False),
    # --- ssh fan-out (ppmulti/procs/launch/nodes.py): one command starts the launch on every node ---
    Flag(("--nodes",), "nodes",
         "start this launch on every node over ssh (BatchMode, your ssh config and keys), node rank = position, "
         "e.g. 10.0.0.1,10.0.0.2; the first is the master. Replaces --nnodes/--node_rank/--master_addr/--ips/--host", metavar="HOST,HOST"),
    Flag(("--ssh-port", "--ssh_port"), "ssh_port", "with --nodes: ssh port, e.g. 2222 (default: your ssh config's)",
         metavar="PORT"),
    Flag(("--ssh-identity", "--ssh_identity"), "ssh_identity", "with --nodes: ssh key file, e.g. ~/.ssh/id_ed25519",
         metavar="KEY"),
    Flag(("--ssh-config", "--ssh_config"), "ssh_config", "with --nodes: ssh config file (ssh -F), e.g. ~/.ssh/cluster",
         metavar="FILE"),
    Flag(("--ssh-option", "--ssh_option"), "ssh_option",
         "with --nodes: an ssh -o option, repeatable, e.g. StrictHostKeyChecking=accept-new", metavar="KEY=VALUE",
         repeat=True),
    Flag(("--ssh-timeout", "--ssh_timeout"), "ssh_timeout",
         "with --nodes: seconds to wait for each node's ssh connection, e.g. 10 (default 10)", metavar="SECONDS"),
    Flag(("--remote-cwd", "--remote_cwd"), "remote_cwd",
         "with --nodes: working directory on every node, e.g. /data/ppmulti (default: this directory)", metavar="DIR"),
    Flag(("--remote-python", "--remote_python"), "remote_python",
         "with --nodes: Python on every node, e.g. /opt/venv/bin/python (default: this one)", metavar="PATH"),
)

# torchrun/Paddle flags that ppmulti cannot honour: refused by name, each with the way out.
UNSUPPORTED: tuple[tuple[tuple[str, ...], bool, str], ...] = (
    (("--rdzv_backend", "--rdzv-backend"), True,
     "ppmulti runs its own rendezvous on --master_addr:--master_port; drop it"),
    (("--rdzv_endpoint", "--rdzv-endpoint"), True, "use --master_addr ADDR --master_port PORT instead"),
    (("--rdzv_id", "--rdzv-id"), True, "use --job_id instead"),
    (("--rdzv_conf", "--rdzv-conf"), True, "use --rdzv-timeout SECONDS for the join timeout; drop the rest"),
    (("--monitor_interval", "--monitor-interval"), True, "Paddle's launcher polls its workers itself; drop it"),
    (("--role",), True, "drop it"),
    (("--tee", "-t"), True, "Paddle's launcher echoes rank 0 and writes every rank to LOG_DIR/workerlog.N; drop it"),
    (("--redirects", "-r"), True, "every rank's output goes to LOG_DIR/workerlog.N (see --log_dir); drop it"),
    (("--local_addr", "--local-addr"), True, "use --host instead"),
    (("--logs_specs", "--logs-specs"), True, "use --log_dir instead"),
    (("--local_ranks_filter", "--local-ranks-filter"), True, "read LOG_DIR/workerlog.N instead"),
    (("--start_method", "--start-method"), True, "Paddle's launcher always starts fresh processes; drop it"),
    (("--no_python", "--no-python"), False, "ppmulti launch runs Python scripts only"),
    (("--module", "-m"), False, "pass the script's file path (Paddle's launcher runs .py files only)"),
    (("--run_path", "--run-path"), False, "drop it: the script is always run by its path"),
    (("--rank",), True, "use --node_rank (Paddle's --rank is the node rank)"),
    (("--legacy",), True, "ppmulti always uses Paddle's new launcher"),
    (("--elastic_level", "--elastic-level", "--elastic_timeout", "--elastic-timeout"), True,
     "elastic training needs an etcd master, which ppmulti launch does not run"),
)

_BY_NAME: dict[str, tuple[bool, str | None]] = {}
for _flag in FLAGS:
    for _name in _flag.names:
        _BY_NAME[_name] = (_flag.takes_value, None)
for _names, _takes, _why in UNSUPPORTED:
    for _name in _names:
        _BY_NAME[_name] = (_takes, f"{_name} is a launcher flag ppmulti launch cannot honour: {_why}")
del _flag, _name, _names, _takes, _why


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse would print usage and exit 2 itself; one line instead
        raise UserError(f"launch: {message}")


def build_parser(prog: str = "ppmulti launch") -> argparse.ArgumentParser:
    """The launch flags as argparse sees them (for --help and typed parsing of the part before the script)."""
    parser = _Parser(
        prog=prog, allow_abbrev=False, formatter_class=argparse.RawDescriptionHelpFormatter,
        usage=f"{prog} [FLAGS] SCRIPT.py [SCRIPT ARGS ...]",
        description="Start one process per rank through Paddle 2.6's launcher, with torchrun's or fleetrun's "
                    "flags. Everything after SCRIPT.py goes to the script.",
        epilog="examples:\n"
               f"  {prog} --nproc_per_node 2 tools/train.py -c configs/yolo.yml\n"
               f"  {prog} --nnodes 2 --node_rank 0 --master_addr 10.0.0.1 --master_port 29500 tools/train.py ...\n"
               f"  {prog} --ips 10.0.0.1,10.0.0.2 --gpus 0,1,2,3 tools/train.py ...\n"
               f"  {prog} --nodes 10.0.0.1,10.0.0.2 --nproc_per_node 2 tools/train.py -c configs/yolo.yml\n"
               "workers also get torchrun's RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT")
    for flag in FLAGS:
        if flag.repeat:
            parser.add_argument(*flag.names, dest=flag.dest, help=flag.help, metavar=flag.metavar, action="append")
        elif flag.takes_value:
            parser.add_argument(*flag.names, dest=flag.dest, help=flag.help, metavar=flag.metavar)
        else:
            parser.add_argument(*flag.names, dest=flag.dest, help=flag.help, action="store_true")
    return parser


def split_argv(argv: list[str]) -> tuple[list[str], str | None, list[str]]:
    """(launcher flags, script, script args): the first bare word is the script; an optional ``--`` may precede it."""
    i = 0
    while i < len(argv):
        item = argv[i]
        if item == "--":
            return argv[:i], (argv[i + 1] if i + 1 < len(argv) else None), argv[i + 2:]
        if item in ("-h", "--help"):
            i += 1
            continue
        if not item.startswith("-") or item == "-":
            return argv[:i], item, argv[i + 1:]
        name = item.split("=", 1)[0]
        if name not in _BY_NAME:
            raise UserError(f"unknown launch flag {name} (before the script); `ppmulti launch --help` lists them, "
                            f"and flags meant for the script go after its path")
        takes_value, refusal = _BY_NAME[name]
        if refusal:
            raise UserError(refusal)
        if takes_value and "=" not in item:
            if i + 1 >= len(argv):
                raise UserError(f"{name} needs a value, e.g. {name} {_example(name)}")
            i += 1
        i += 1
    return argv, None, []


def _example(name: str) -> str:
    for flag in FLAGS:
        if name in flag.names and flag.help and "e.g. " in flag.help:
            return flag.help.split("e.g. ", 1)[1].split()[0].rstrip(";,)")
    return "VALUE"


def parse_launch_args(argv: list[str]) -> argparse.Namespace:
    """Parse ``ppmulti launch`` argv: flags in either spelling, then SCRIPT and its untouched arguments."""
    flags, script, script_args = split_argv(list(argv))
    ns = build_parser().parse_args(flags)
    ns.script = script
    ns.script_args = list(script_args)
    return ns


# ---------------------------------------------------------------------------------------------------------
def _int(value: str | None, flag: str, example: str) -> int | None:
    if value is None:
        return None
    try:
        return int(str(value).strip())
    except ValueError:
        raise UserError(f"{flag} {value!r}: expected a whole number, e.g. {flag} {example}") from None


def _port(value: str | None, flag: str) -> int | None:
    port = _int(value, flag, "29500")
    if port is not None and not 1 <= port <= 65535:
        raise UserError(f"{flag} {value}: not a TCP port (1..65535), e.g. {flag} 29500")
    return port


def _ids(value: str, flag: str) -> tuple[str, ...]:
    ids = tuple(x.strip() for x in value.split(",") if x.strip())
    if not ids or not all(x.isdigit() for x in ids) or len(set(ids)) != len(ids):
        raise UserError(f"{flag} {value!r}: expected distinct GPU ids like 0,1,2,3")
    return ids


def _is_loopback(addr: str) -> bool:
    try:
        return ipaddress.ip_address(addr).is_loopback
    except ValueError:
        return addr == "localhost"


def _visible_gpu_labels(environ: Mapping[str, str]) -> list[str] | None:
    value = environ.get(E.CUDA_VISIBLE_DEVICES)
    if value is None or value.strip() in ("", "all"):
        return None
    return [x.strip() for x in value.split(",") if x.strip()]


def build_plan(ns: argparse.Namespace, environ: Mapping[str, str], local_addrs: set[str],
               device_count: int | None) -> LaunchPlan:
    """Turn parsed flags into a checked LaunchPlan; ``local_addrs`` and ``device_count`` come from the caller."""
    notes: list[str] = []
    if not ns.script:
        raise UserError("no training script given: ppmulti launch [FLAGS] SCRIPT.py [SCRIPT ARGS], "
                        "e.g. ppmulti launch --nproc_per_node 2 tools/train.py -c configs/yolo.yml")
    if not ns.script.endswith(".py"):
        raise UserError(f"{ns.script}: ppmulti launch runs Python scripts; pass the path of a .py file")

    # --- nodes -------------------------------------------------------------------------------------
    nnodes_text = ns.nnodes
    if nnodes_text is not None and ":" in str(nnodes_text):
        raise UserError(f"--nnodes {nnodes_text}: elastic MIN:MAX node ranges need an etcd master; give one number")
    nnodes = _int(nnodes_text, "--nnodes", "2")
    node_rank = _int(ns.node_rank, "--node_rank", "1")
    master_addr, master_port = ns.master_addr, _port(ns.master_port, "--master_port")
    master_port_flag = "--master_port" if master_port is not None else None
    if ns.master:
        if master_addr or master_port is not None:
            raise UserError(f"--master {ns.master} together with --master_addr/--master_port: give one of them")
        addr, _, port = str(ns.master).replace("http://", "").rpartition(":")
        if not addr:
            raise UserError(f"--master {ns.master!r}: expected ADDR:PORT, e.g. --master 10.0.0.1:29500")
        master_addr, master_port, master_port_flag = addr, _port(port, "--master"), "--master"
    if ns.standalone and ((nnodes or 1) > 1 or ns.ips or master_addr):
        raise UserError("--standalone means one node; drop --nnodes/--ips/--master_addr or drop --standalone")
    if ns.standalone:
        nnodes = 1

    host = ns.host or environ.get(E.POD_IP) or None
    if ns.host is None and host:
        notes.append(f"--host {host} from {E.POD_IP}")
    ips: tuple[str, ...] = ()
    if ns.ips:
        ips = tuple(x.strip() for x in str(ns.ips).split(",") if x.strip())
        if not ips:
            raise UserError(f"--ips {ns.ips!r}: expected addresses like 10.0.0.1,10.0.0.2")
        if master_addr or master_port_flag:
            raise UserError(f"--ips {ns.ips} together with --master_addr/--master_port: use one way to name "
                            f"the nodes (--ips, or --master_addr with --nnodes and --node_rank)")
        if nnodes is not None and nnodes != len(ips):
            raise UserError(f"--nnodes {nnodes} disagrees with --ips {ns.ips} ({len(ips)} nodes); drop --nnodes")
        if len(ips) > 1 and "127.0.0.1" in ips:
            raise UserError(f"--ips {ns.ips}: 127.0.0.1 cannot be one node of several (Paddle refuses it); "
                            f"to run several nodes on one machine use other loopback addresses, "
                            f"e.g. --ips 127.0.0.2,127.0.0.3 --host 127.0.0.2")
        nnodes = len(ips)
        host = _host_in_ips(ips, host, local_addrs, explicit=ns.host is not None)
        if node_rank is not None and node_rank != ips.index(host):
            raise UserError(f"--node_rank {node_rank} disagrees with --host {host}, which is node "
                            f"{ips.index(host)} of --ips {ns.ips}; drop --node_rank")
        node_rank = ips.index(host)
    nnodes = nnodes or 1
    if nnodes > 1 and not ips:
        if node_rank is None:
            raise UserError(f"--nnodes {nnodes} needs --node_rank on every node: 0 on the machine at "
                            f"--master_addr, 1 .. {nnodes - 1} on the others")
        if not master_addr:
            raise UserError(f"--nnodes {nnodes} needs --master_addr (the address of the node started with "
                            f"--node_rank 0), e.g. --master_addr 10.0.0.1")
        if node_rank == 0 and local_addrs and _is_ip(master_addr) and not _is_loopback(master_addr) \
                and master_addr not in local_addrs and master_addr != "0.0.0.0":
            raise UserError(f"--node_rank 0 runs the rendezvous at --master_addr {master_addr}, which is not an "
                            f"address of this machine ({', '.join(sorted(local_addrs))}); start node 0 on "
                            f"{master_addr} or fix --master_addr")
        if master_port is None:
            master_port = DEFAULT_MASTER_PORT
            notes.append(f"--master_port {DEFAULT_MASTER_PORT} (torchrun's default)")
    node_rank = node_rank or 0

    # --- devices -----------------------------------------------------------------------------------
    given = [(flag, getattr(ns, dest)) for flag, dest in
             (("--gpus", "gpus"), ("--selected_gpus", "selected_gpus"), ("--devices", "devices"))
             if getattr(ns, dest)]
    if len({_ids(v, f) for f, v in given}) > 1:
        raise UserError(" and ".join(f"{f} {v}" for f, v in given) + " disagree; give one of them")
    dev_flag, dev_value = given[0] if given else (None, None)
    gpu_ids = _ids(dev_value, dev_flag) if dev_value else ()
    device = (ns.device or "").strip().lower() or None
    if device not in (None, "cpu", "gpu"):
        raise UserError(f"--device {ns.device!r}: expected cpu or gpu")
    if device is None:
        device = "gpu" if gpu_ids or (device_count or 0) > 0 else "cpu"
    nproc_text = ns.nproc_per_node
    if device == "cpu":
        if gpu_ids:
            raise UserError(f"--device cpu with {dev_flag} {dev_value}: drop one of them")
        if nproc_text in ("auto", "gpu"):
            raise UserError(f"--nproc_per_node {nproc_text}: no GPU is visible; give a number, e.g. "
                            f"--nproc_per_node 2 for 2 CPU ranks (gloo)")
        nproc = _int(nproc_text, "--nproc_per_node", "2")
        nproc = 1 if nproc is None else nproc
        if device_count and nproc > device_count:
            # Paddle's launcher binds rank i to GPU i whenever it sees GPUs, even for gloo ranks
            raise UserError(f"--device cpu --nproc_per_node {nproc}: Paddle 2.6's launcher gives every rank one "
                            f"of this machine's {device_count} GPU(s), so at most {device_count} CPU ranks here")
    else:
        labels = _visible_gpu_labels(environ)
        if gpu_ids and labels is not None:
            missing = [g for g in gpu_ids if g not in labels]
            if missing:
                raise UserError(f"{dev_flag} {dev_value}: GPU {missing[0]} is not in {E.CUDA_VISIBLE_DEVICES}="
                                f"{','.join(labels)}; Paddle's launcher takes ids as listed there")
        available = labels if labels is not None else [str(i) for i in range(device_count or 0)]
        if nproc_text in ("auto", "gpu"):
            nproc_text = None
        nproc = _int(nproc_text, "--nproc_per_node", "2")
        if nproc is not None and nproc < 1:
            raise UserError(f"--nproc_per_node {nproc}: need at least 1 process per node")
        if gpu_ids:
            if nproc is not None and nproc != len(gpu_ids):
                raise UserError(f"--nproc_per_node {nproc} disagrees with {dev_flag} {dev_value} "
                                f"({len(gpu_ids)} GPUs); give one of them")
        else:
            if device_count is not None and not available:
                raise UserError("--device gpu: no GPU is visible on this machine; use --device cpu")
            if nproc is not None and device_count is not None and nproc > len(available):
                raise UserError(f"--nproc_per_node {nproc}: only {len(available)} GPU(s) are visible; use at most "
                                f"{len(available)}, or --device cpu")
            count = nproc if nproc is not None else len(available)
            if count < 1:
                raise UserError("--device gpu: cannot tell how many GPUs there are; pass --gpus 0,1,...")
            gpu_ids = tuple(available[:count]) if available else tuple(str(i) for i in range(count))
        nproc = len(gpu_ids)

    # --- ports and the rest --------------------------------------------------------------------------
    start_port, start_flag = DEFAULT_START_PORT, None
    for flag, value in ((E.FLAGS_START_PORT, environ.get(E.FLAGS_START_PORT)),
                        (E.PADDLE_START_PORT, environ.get(E.PADDLE_START_PORT)),
                        ("--start_port", ns.start_port)):
        if value in (None, ""):
            continue
        if flag.startswith("--"):
            start_port = _port(value, flag) or 0
        elif not str(value).strip().isdigit() or not 1 <= int(value) <= 65535:
            raise UserError(f"{flag}={value} in the environment is not a TCP port (1..65535); fix or unset it, "
                            f"or pass --start_port")
        else:
            start_port = int(value)
        start_flag = flag
    if start_flag and not start_flag.startswith("--"):
        notes.append(f"--start_port {start_port} from {start_flag} (Paddle 2.6's launcher ignores that variable)")
    timeout = DEFAULT_RDZV_TIMEOUT
    if ns.rdzv_timeout is not None:
        try:
            timeout = float(ns.rdzv_timeout)
        except ValueError:
            raise UserError(f"--rdzv-timeout {ns.rdzv_timeout!r}: expected seconds, e.g. --rdzv-timeout 60") from None
    if ips and host and not ns.host and not environ.get(E.POD_IP):
        notes.append(f"--host {host}: the one address of --ips that belongs to this machine")

    return LaunchPlan(
        script=ns.script, script_args=tuple(ns.script_args), nproc_per_node=nproc, nnodes=nnodes,
        node_rank=node_rank, master_addr=master_addr, master_port=master_port, master_port_flag=master_port_flag,
        ips=ips, host=host, device=device, devices=gpu_ids if device == "gpu" else (), start_port=start_port,
        start_port_flag=start_flag, log_dir=ns.log_dir, max_restarts=_int(ns.max_restarts, "--max_restarts", "3"),
        job_id=ns.job_id, rdzv_timeout=timeout, notes=tuple(notes))


def _is_ip(addr: str) -> bool:
    try:
        ipaddress.ip_address(addr)
        return True
    except ValueError:
        return False


def _host_in_ips(ips: tuple[str, ...], host: str | None, local_addrs: set[str], explicit: bool) -> str:
    """This node's entry in --ips. Paddle would silently act as node 0 when it is not in the list."""
    listed = ",".join(ips)
    if host:
        if host not in ips:
            origin = "--host" if explicit else E.POD_IP
            raise UserError(f"{origin} {host} is not one of --ips {listed}; pass --host with this node's address "
                            f"from the list")
        return host
    mine = [ip for ip in ips if ip in local_addrs or _is_loopback(ip)]
    if len(mine) == 1:
        return mine[0]
    if not mine:
        known = ", ".join(sorted(local_addrs)) or "unknown"
        raise UserError(f"this machine (addresses {known}) is none of --ips {listed}; pass --host with this node's "
                        f"address from the list, e.g. --host {ips[0]}")
    raise UserError(f"several of --ips {listed} are addresses of this machine ({', '.join(mine)}); pass --host to "
                    f"say which node this is, e.g. --host {mine[0]}")


# ---------------------------------------------------------------------------------------------------------
def to_paddle(plan: LaunchPlan) -> tuple[list[str], dict[str, str]]:
    """The ``python -m paddle.distributed.launch`` argv (new launcher only) and the environment to add."""
    argv = [sys.executable, "-m", "paddle.distributed.launch"]
    if plan.device == "gpu":
        argv += ["--devices", ",".join(plan.devices)]
    else:
        argv += ["--nproc_per_node", str(plan.nproc_per_node)]
    if plan.mode == "master":
        addr, port = plan.rdzv_endpoint  # type: ignore[misc]
        argv += ["--master", f"{addr}:{port + 1}", "--nnodes", str(plan.nnodes), "--rank", str(plan.node_rank)]
        if plan.host:
            argv += ["--host", plan.host]
    elif plan.mode == "ips":
        argv += ["--ips", ",".join(plan.ips), "--host", str(plan.host), "--start_port", str(plan.start_port)]
    elif plan.host:
        argv += ["--host", plan.host]
    if plan.log_dir:
        argv += ["--log_dir", plan.log_dir]
    if plan.job_id:
        argv += ["--job_id", plan.job_id]
    # --max_restarts stays with ppmulti (runner.run): Paddle's own restarts loop only under an etcd master
    argv += [WORKER_PATH, plan.script, *plan.script_args]

    env = {E.PPMULTI_NODE_RANK: str(plan.node_rank)}
    if plan.device == "cpu":
        env[E.PADDLE_DISTRI_BACKEND] = "gloo"
    return argv, env


def launch_env(plan: LaunchPlan, environ: Mapping[str, str]) -> tuple[dict[str, str], dict[str, str], list[str]]:
    """(full child environment, variables set or changed, variables removed) for the Paddle launcher."""
    _, changes = to_paddle(plan)
    child = E.clean_launcher_env(environ)
    removed = sorted(k for k in environ if k not in child)
    child.update(changes)
    changed = {k: v for k, v in changes.items() if environ.get(k) != v}
    removed = [k for k in removed if k not in changes]
    return child, changed, removed


def describe(plan: LaunchPlan, environ: Mapping[str, str]) -> str:
    """What --dry-run prints: the command, then one KEY=VALUE per set variable and ``unset KEY`` per removed one."""
    argv, _ = to_paddle(plan)
    _, changed, removed = launch_env(plan, environ)
    lines = [shlex.join(argv)]
    lines += [f"{k}={v}" for k, v in sorted(changed.items())]
    lines += [f"unset {k}" for k in removed]
    lines += [f"# {note}" for note in plan.notes]
    return "\n".join(lines) + "\n"
