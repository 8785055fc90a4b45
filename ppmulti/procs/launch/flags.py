"""Pure flag mapping: torchrun's and fleetrun's launch flags -> LaunchPlan -> Paddle launcher argv + env."""

from __future__ import annotations

import argparse
import ipaddress
import shlex
import sys
from dataclasses import dataclass
from typing import Mapping

from ppmulti.common import envvars as E
from ppmulti.common.compat import LauncherSpec, launcher_spec
from ppmulti.common.errors import UserError
from ppmulti.common.flags import BY_DEST, Flag, refusal
from ppmulti.common.paths import WORKER_SCRIPT
from ppmulti.procs.launch.cluster_env import Resolve, with_cluster
from ppmulti.procs.launch.plan import (DEFAULT_HANG_TIMEOUT, DEFAULT_MASTER_PORT, DEFAULT_RDZV_TIMEOUT,
                                       DEFAULT_START_PORT, LaunchPlan,
                                       check_device, check_gpu_count, check_host_in_ips, check_ips,
                                       check_master_addr, check_no_gpus_on_cpu, check_node_rank_in_ips, check_nproc,
                                       check_port, check_script)

# The launcher runs a training script with Python only when its name ends in LauncherSpec.script_suffix
# (.py), so the worker shim is passed by its file path.
WORKER_PATH = str(WORKER_SCRIPT)


def _l(names: tuple[str, ...], dest: str, help: str, metavar: str | None = None, bare: bool = False,
       repeat: bool = False, exact: tuple[str, ...] = ()) -> Flag:
    """A launch flag: a value after it (shown as ``metavar``), none (``bare``), or repeatable (``repeat``: the
    values kept in order); the dash/underscore twin of each name comes along, ``exact`` names do not."""
    value = {"action": "store_true"} if bare else {"action": "append", "metavar": metavar} if repeat else \
        {"metavar": metavar}
    return Flag(names, dest, help, ("launch",), value, exact=exact)


def _shared(dest: str, help: str, **value) -> Flag:
    """A flag of the shared table (common/flags.py) with launch's own help text and metavar."""
    return BY_DEST[dest].told(help, **value)


FLAGS: tuple[Flag, ...] = (
    _l(("--nproc_per_node",), "nproc_per_node",
       "processes (ranks) on this node, e.g. 2; 'gpu' or 'auto' = one per visible GPU. On a machine without "
       "GPUs (or with --device cpu) the ranks run on the CPU with gloo", metavar="N"),
    _l(("--nnodes",), "nnodes", "number of nodes (machines), e.g. 2 (default 1); MIN:MAX, e.g. 1:4, with an etcd "
       "master (--rdzv-backend etcd or --master etcd://): the run goes on with the nodes alive, at least MIN",
       metavar="N"),
    _l(("--node_rank", "--rank"), "node_rank",
       "this node's rank, 0 .. nnodes-1, e.g. 1; node 0 runs at --master_addr (--rank is Paddle's spelling)",
       metavar="R"),
    _l(("--master_addr",), "master_addr",
       "address of node 0, e.g. 10.0.0.1 (needed with --nnodes > 1)", metavar="ADDR"),
    _l(("--master_port",), "master_port",
       f"port on node 0, e.g. 29500 (default {DEFAULT_MASTER_PORT} for several nodes, a free one for one node); "
       f"ppmulti's rendezvous and rank 0's store use it, Paddle's HTTP rendezvous the next one", metavar="PORT"),
    _l(("--master",), "master", "Paddle's spelling of --master_addr/--master_port, e.g. 10.0.0.1:29500; "
       "etcd://HOST:PORT names an etcd server for --nnodes MIN:MAX (the same as --rdzv-backend etcd "
       "--rdzv-endpoint HOST:PORT)", metavar="ADDR:PORT"),
    _l(("--rdzv-backend",), "rdzv_backend",
       "etcd: the nodes meet in etcd (--rdzv-endpoint) and --nnodes may be MIN:MAX; nothing else is taken "
       "(without it ppmulti's own rendezvous runs on --master_addr:--master_port)", metavar="etcd"),
    _l(("--rdzv-endpoint",), "rdzv_endpoint",
       "with --rdzv-backend etcd: etcd's client address, e.g. 10.0.0.1:2379", metavar="HOST:PORT"),
    _l(("--rdzv-id",), "rdzv_id",
       "with an etcd master: the run's name in etcd, the same on every node, e.g. yolo_run1 (default: --job_id, "
       "else 'default')", metavar="NAME"),
    _l(("--elastic_level",), "elastic_level",
       "Paddle's elastic level, with an etcd master: 1 (the node count may change within --nnodes MIN:MAX) or 0 "
       "(a fixed --nnodes N, restarted when a node fails), e.g. 1", metavar="LEVEL"),
    _l(("--elastic_timeout",), "elastic_timeout",
       f"with an etcd master: seconds the first round waits for more than MIN nodes, e.g. 10 "
       f"(default {30:g}, Paddle's)", metavar="SECONDS"),
    _l(("--standalone",), "standalone", "one node on its own (the same as --nnodes 1)", bare=True),
    _l(("--max_restarts",), "max_restarts",
       "restart every rank up to N times when one fails, e.g. 3 (default 0); ppmulti restarts the launch "
       "itself (Paddle restarts only under etcd) and ppmulti's training resumes from its last checkpoint; "
       "--max_restart is Paddle's spelling (its default 3 applies under etcd only: here the default is 0)",
       metavar="N", exact=("--max_restart",)),
    _l(("--gpus",), "gpus", "GPU ids, one rank each, e.g. 0,1,2,3 (fleetrun)", metavar="IDS"),
    _l(("--selected_gpus",), "selected_gpus",
       "the legacy fleetrun spelling of --gpus, e.g. 0,1; runs on Paddle's new launcher", metavar="IDS",
       exact=("--selected_gpu",)),
    _shared("devices", "Paddle's spelling of --gpus, e.g. 0,1", metavar="IDS"),
    _shared("device", "cpu or gpu (default: gpu when GPUs are visible, else cpu)", metavar="KIND"),
    _l(("--ips",), "ips", "every node's address, fleetrun style, e.g. 10.0.0.1,10.0.0.2; node rank = position",
       metavar="IP,IP"),
    _shared("host", "this node's address in --ips (or for Paddle's endpoints), e.g. 10.0.0.2",
            metavar="IP"),
    _l(("--log_dir",), "log_dir", "directory for Paddle's workerlog.N files, e.g. log (default ./log)",
       metavar="DIR"),
    _l(("--start_port",), "start_port",
       f"first worker port under --ips, e.g. 17000 (default: FLAGS_START_PORT, else {DEFAULT_START_PORT}); "
       f"ppmulti's rendezvous uses the port just below", metavar="PORT"),
    _l(("--job_id",), "job_id", "job name (Paddle's log file names), e.g. yolo_run1", metavar="NAME"),
    _l(("--rdzv-timeout",), "rdzv_timeout",
       f"seconds to wait for missing nodes before giving up, e.g. 60 (default {DEFAULT_RDZV_TIMEOUT:g})",
       metavar="SECONDS"),
    _l(("--rdzv-token-file",), "rdzv_token_file",
       f"file whose first line is the secret every node of the run proves it knows in the rendezvous (an HMAC, "
       f"never the secret itself, goes over the network), e.g. /run/secrets/rdzv; default: "
       f"{E.PPMULTI_RDZV_TOKEN} from the environment, else a key derived from the job id", metavar="FILE"),
    _l(("--run_mode",), "run_mode",
       "Paddle's run mode; only collective (data parallel, the default) is supported, e.g. collective",
       metavar="MODE"),
    _l(("--log_level",), "log_level",
       "passed to Paddle's launcher: its own log level, e.g. DEBUG (default INFO)", metavar="LEVEL"),
    _l(("--log_overwrite",), "log_overwrite",
       "passed to Paddle's launcher: overwrite LOG_DIR/workerlog.N instead of appending, e.g. true", metavar="BOOL"),
    _l(("--enable_gpu_log",), "enable_gpu_log",
       "passed to Paddle's launcher: whether it logs GPU usage, e.g. false (default true)", metavar="BOOL"),
    _l(("--check-network",), "check_network",
       "meet the other nodes, report the interface each one reaches node 0 over and its link speed (a gradient "
       "all-reduce's worth of data from node 0, see --network-check-mb), all-reduce that much float32 on every "
       "rank (gloo on CPU, NCCL on GPUs) and report its bus bandwidth, name the slowest node, and stop: "
       "no training", bare=True),
    _l(("--no-network-check",), "no_network_check",
       "skip the quick network check (4 MB per node) a multi-node launch makes before training",
       bare=True),
    _l(("--network-check-mb",), "network_check_mb",
       "MB node 0 sends each node to time its link, and --check-network's all-reduce size: your model's "
       "gradients, 4 bytes a parameter, e.g. 64 (default 32 with --check-network, about YOLOv5s's; else 4)",
       metavar="MB"),
    _shared("verbose", "show Paddle's launcher configuration, glog and topology lines on the console "
            "(they always go to LOG_DIR)"),
    _l(("--hang-timeout",), "hang_timeout",
       f"seconds a rank may make no progress (no step, no CPU) before it is named as hung, its stack and every "
       f"rank's written to LOG_DIR/stacks.rankN.txt and all ranks stopped or restarted, e.g. 120 "
       f"(default {DEFAULT_HANG_TIMEOUT:g}; 0 turns the watchdog off)", metavar="SECONDS"),
    _l(("--dry-run",), "dry_run", "print the Paddle command and environment changes; run nothing",
       bare=True),
    # --- ssh fan-out (ppmulti/procs/launch/nodes.py): one command starts the launch on every node ---
    _l(("--nodes",), "nodes",
       "start this launch on every node over ssh (BatchMode, your ssh config and keys), node rank = position, "
       "e.g. 10.0.0.1,10.0.0.2; the first is the master. Replaces --nnodes/--node_rank/--master_addr/--ips/--host",
       metavar="HOST,HOST"),
    _l(("--ssh-port",), "ssh_port", "with --nodes: ssh port, e.g. 2222 (default: your ssh config's)",
       metavar="PORT"),
    _l(("--ssh-identity",), "ssh_identity", "with --nodes: ssh key file, e.g. ~/.ssh/id_ed25519",
       metavar="KEY"),
    _l(("--ssh-config",), "ssh_config", "with --nodes: ssh config file (ssh -F), e.g. ~/.ssh/cluster",
       metavar="FILE"),
    _l(("--ssh-option",), "ssh_option",
       "with --nodes: an ssh -o option, repeatable, e.g. StrictHostKeyChecking=accept-new", metavar="KEY=VALUE",
       repeat=True),
    _l(("--ssh-timeout",), "ssh_timeout",
       "with --nodes: seconds to wait for each node's ssh connection, e.g. 10 (default 10)", metavar="SECONDS"),
    _l(("--remote-cwd",), "remote_cwd",
       "with --nodes: working directory on every node, e.g. /data/ppmulti (default: this directory)", metavar="DIR"),
    _l(("--remote-python",), "remote_python",
       "with --nodes: Python on every node, e.g. /opt/venv/bin/python (default: this one)", metavar="PATH"),
)

# torchrun/Paddle flags that ppmulti cannot honour: refused by name, each with the way out.
REFUSED: tuple[Flag, ...] = (
    refusal("launch", ("--rdzv_conf", "--rdzv-conf"),
            "use --rdzv-timeout SECONDS for the join timeout; drop the rest"),
    refusal("launch", ("--monitor_interval", "--monitor-interval"),
            "Paddle's launcher polls its workers itself; drop it"),
    refusal("launch", ("--role",), "drop it"),
    refusal("launch", ("--tee", "-t"),
            "Paddle's launcher echoes rank 0 and writes every rank to LOG_DIR/workerlog.N; drop it"),
    refusal("launch", ("--redirects", "-r"),
            "every rank's output goes to LOG_DIR/workerlog.N (see --log_dir); drop it"),
    refusal("launch", ("--local_addr", "--local-addr"), "use --host instead"),
    refusal("launch", ("--logs_specs", "--logs-specs"), "use --log_dir instead"),
    refusal("launch", ("--local_ranks_filter", "--local-ranks-filter"), "read LOG_DIR/workerlog.N instead"),
    refusal("launch", ("--start_method", "--start-method"),
            "Paddle's launcher always starts fresh processes; drop it"),
    refusal("launch", ("--no_python", "--no-python"), "ppmulti launch runs Python scripts only",
            action="store_true"),
    refusal("launch", ("--module", "-m"), "pass the script's file path (Paddle's launcher runs .py files only)",
            action="store_true"),
    refusal("launch", ("--run_path", "--run-path"), "drop it: the script is always run by its path",
            action="store_true"),
    refusal("launch", ("--legacy",), "ppmulti always uses Paddle's new launcher"),
    # the rest of Paddle's launchers' flags (paddle.distributed.launch and the legacy fleet/launch.py)
    refusal("launch", ("--sort_ip",),
            "node ranks are ppmulti's: --node_rank, or the order of --ips / --nodes; drop it"),
    refusal("launch", ("--npus", "--xpus", "--selected_xpus"),
            "ppmulti runs on the CPU (gloo) and on NVIDIA GPUs (--devices); Ascend NPUs and Kunlun XPUs are not "
            "supported"),
    refusal("launch", ("--backend",),
            "ppmulti picks the backend from the device: gloo on the CPU, NCCL on GPUs (--device)"),
    refusal("launch", ("--auto_parallel_config", "--auto_cluster_config", "--auto_tuner_json", "--cluster_topo_path",
                       "--rank_mapping_path", "--enable_auto_mapping"),
            "it configures Paddle's auto-parallel or auto-tuner; ppmulti trains data-parallel, every rank a whole "
            "model"),
    refusal("launch", ("--servers", "--trainers", "--trainer_num", "--server_num", "--workers", "--worker_num",
                       "--coordinators", "--coordinator_num", "--heter_workers", "--heter_worker_num",
                       "--heter_devices", "--gloo_port", "--with_gloo", "--http_port"),
            "it belongs to Paddle's parameter-server mode; ppmulti trains collectively (all-reduce), drop it"),
    refusal("launch", ("--elastic_server", "--elastic_pre_hook", "--np", "--scale", "--force"),
            "the legacy launcher's elastic mode needs an etcd server, which ppmulti launch does not run; "
            "for restarts use --max_restarts"),
)
# (spellings, takes a value, why) of each refused flag
UNSUPPORTED: tuple[tuple[tuple[str, ...], bool, str], ...] = tuple(
    (flag.spellings, flag.takes_value, flag.uses["launch"].text) for flag in REFUSED)

_BY_NAME: dict[str, tuple[bool, str | None]] = {}
for _flag in FLAGS:
    for _name in _flag.spellings:
        _BY_NAME[_name] = (_flag.takes_value, None)
for _flag in REFUSED:
    for _name in _flag.spellings:
        _BY_NAME[_name] = (_flag.takes_value, f"{_name} is a launcher flag ppmulti launch cannot honour: "
                                              f"{_flag.uses['launch'].text}")
del _flag, _name


_CANON = {name: flag.spellings[0] for flag in FLAGS for name in flag.spellings}


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse would print usage and exit 2 itself; one line instead
        raise UserError(f"launch: {message}")


def build_parser(prog: str = "ppmulti launch") -> argparse.ArgumentParser:
    """The launch flags as argparse sees them (for --help and typed parsing of the part before the script)."""
    parser = _Parser(
        prog=prog, allow_abbrev=False, formatter_class=argparse.RawDescriptionHelpFormatter,
        usage=f"{prog} [FLAGS] SCRIPT.py [SCRIPT ARGS ...]",
        description="Start one process per rank through Paddle's launcher (paddle.distributed.launch), with "
                    "torchrun's or fleetrun's flags. Everything after SCRIPT.py goes to the script.",
        epilog="examples:\n"
               f"  {prog} --nproc_per_node 2 tools/train.py -c configs/yolo.yml\n"
               f"  {prog} --nnodes 2 --node_rank 0 --master_addr 10.0.0.1 --master_port 29500 tools/train.py ...\n"
               f"  {prog} --ips 10.0.0.1,10.0.0.2 --gpus 0,1,2,3 tools/train.py ...\n"
               f"  {prog} --nodes 10.0.0.1,10.0.0.2 --nproc_per_node 2 tools/train.py -c configs/yolo.yml\n"
               "workers also get torchrun's RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT")
    for flag in FLAGS:
        flag.add_to(parser)
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
            # Paddle's and torchrun's parsers take a unique prefix (argparse's abbreviations); ppmulti wants it whole
            whole = sorted({_CANON.get(n, n) for n in _BY_NAME if n.startswith(name)}) if len(name) > 3 else []
            hint = (f"; did you mean {whole[0]}? (ppmulti launch takes flags spelled out)" if len(whole) == 1
                    else "; `ppmulti launch --help` lists them, and flags meant for the script go after its path")
            raise UserError(f"unknown launch flag {name} (before the script){hint}")
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
        if name in flag.spellings and flag.help and "e.g. " in flag.help:
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
# Flags -> plan, one concern per builder. Each returns a small frozen piece with its values checked by plan.py's
# check_* functions (the one home of each rule and its message); build_plan composes them into a LaunchPlan.

def _int(value: str | None, flag: str, example: str) -> int | None:
    if value is None:
        return None
    try:
        return int(str(value).strip())
    except ValueError:
        raise UserError(f"{flag} {value!r}: expected a whole number, e.g. {flag} {example}") from None


def _port(value: str | None, flag: str) -> int | None:
    return None if value is None else check_port(value, flag)


def _is_loopback(addr: str) -> bool:
    try:
        return ipaddress.ip_address(addr).is_loopback
    except ValueError:
        return addr == "localhost"


def _is_ip(addr: str) -> bool:
    try:
        ipaddress.ip_address(addr)
        return True
    except ValueError:
        return False


def _visible_gpu_labels(environ: Mapping[str, str]) -> list[str] | None:
    value = environ.get(E.CUDA_VISIBLE_DEVICES)
    if value is None or value.strip() in ("", "all"):
        return None
    return [x.strip() for x in value.split(",") if x.strip()]


# --- script ------------------------------------------------------------------------------------------------
def script_of(ns: argparse.Namespace, spec: LauncherSpec) -> tuple[str, tuple[str, ...]]:
    """(script, its arguments): a file the launcher runs with Python, arguments untouched."""
    return check_script(ns.script, spec.script_suffix), tuple(ns.script_args)


# --- nodes: --nnodes/--node_rank/--master*/--standalone/--ips/--host --------------------------------------
@dataclass(frozen=True)
class Master:
    """Node 0's address and port as the user named them: --master_addr/--master_port or --master ADDR:PORT."""

    addr: str | None = None
    port: int | None = None
    port_flag: str | None = None      # the flag that named the port; None = not named


@dataclass(frozen=True)
class Nodes:
    """Which node this is among how many, and how the nodes find each other (LaunchPlan's node fields)."""

    nnodes: int = 1
    node_rank: int = 0
    master_addr: str | None = None
    master_port: int | None = None
    master_port_flag: str | None = None
    ips: tuple[str, ...] = ()
    host: str | None = None
    notes: tuple[str, ...] = ()


def master_of(ns: argparse.Namespace) -> Master:
    """--master_addr/--master_port, or Paddle's --master ADDR:PORT, never both."""
    port = _port(ns.master_port, "--master_port")
    if not ns.master:
        return Master(ns.master_addr, port, "--master_port" if port is not None else None)
    if str(ns.master).startswith("etcd://"):
        return Master(ns.master_addr, port, "--master_port" if port is not None else None)   # elastic_of reads it
    if ns.master_addr or port is not None:
        raise UserError(f"--master {ns.master} together with --master_addr/--master_port: give one of them")
    addr, _, port_text = str(ns.master).replace("http://", "").rpartition(":")
    if not addr:
        raise UserError(f"--master {ns.master!r}: expected ADDR:PORT, e.g. --master 10.0.0.1:29500")
    return Master(addr, check_port(port_text, "--master", "10.0.0.1:29500"), "--master")


def _nnodes(ns: argparse.Namespace) -> int | None:
    if ns.nnodes is not None and ":" in str(ns.nnodes):
        raise UserError(f"--nnodes {ns.nnodes}: elastic MIN:MAX node ranges need an etcd master (--rdzv-backend etcd "
                        f"--rdzv-endpoint HOST:2379, or --master etcd://HOST:2379); give one number")
    return _int(ns.nnodes, "--nnodes", "2")


def nodes_of(ns: argparse.Namespace, environ: Mapping[str, str], local_addrs: set[str]) -> Nodes:
    """The node flags as one Nodes: fleetrun's --ips, torchrun's --master_addr with --nnodes, or one node."""
    nnodes = _nnodes(ns)
    node_rank = _int(ns.node_rank, "--node_rank", "1")
    master = master_of(ns)
    if ns.standalone and ((nnodes or 1) > 1 or ns.ips or master.addr):
        raise UserError("--standalone means one node; drop --nnodes/--ips/--master_addr or drop --standalone")
    if ns.standalone:
        nnodes = 1
    host = ns.host or environ.get(E.POD_IP) or None
    notes = (f"--host {host} from {E.POD_IP}",) if ns.host is None and host else ()
    if ns.ips:
        return _ips_nodes(ns, nnodes, node_rank, master, host, notes, local_addrs)
    return _master_nodes(nnodes or 1, node_rank, master, host, notes, local_addrs)


def _ips_nodes(ns: argparse.Namespace, nnodes: int | None, node_rank: int | None, master: Master,
               host: str | None, notes: tuple[str, ...], local_addrs: set[str]) -> Nodes:
    """fleetrun's --ips: node rank = position of this node's address in the list."""
    ips = tuple(x.strip() for x in str(ns.ips).split(",") if x.strip())
    if not ips:
        raise UserError(f"--ips {ns.ips!r}: expected addresses like 10.0.0.1,10.0.0.2")
    check_ips(ips, len(ips) if nnodes is None else nnodes, master.addr, master.port_flag)
    # an address listed twice is left to LaunchPlan: that check comes after this node's address is found
    found = host is None
    host = _host_in_ips(ips, host, local_addrs, origin="--host" if ns.host is not None else E.POD_IP)
    if node_rank is not None:
        check_node_rank_in_ips(ips, host, node_rank)
    if found:
        notes += (f"--host {host}: the one address of --ips that belongs to this machine",)
    return Nodes(len(ips), ips.index(host), master.addr, master.port, master.port_flag, ips, host, notes)


def _host_in_ips(ips: tuple[str, ...], host: str | None, local_addrs: set[str], origin: str) -> str:
    """This node's entry in --ips. Paddle would silently act as node 0 when it is not in the list."""
    if host:
        return check_host_in_ips(ips, host, origin)
    listed = ",".join(ips)
    mine = [ip for ip in ips if ip in local_addrs or _is_loopback(ip)]
    if len(mine) == 1:
        return mine[0]
    if not mine:
        known = ", ".join(sorted(local_addrs)) or "unknown"
        raise UserError(f"this machine (addresses {known}) is none of --ips {listed}; pass --host with this node's "
                        f"address from the list, e.g. --host {ips[0]}")
    raise UserError(f"several of --ips {listed} are addresses of this machine ({', '.join(mine)}); pass --host to "
                    f"say which node this is, e.g. --host {mine[0]}")


def _master_nodes(nnodes: int, node_rank: int | None, master: Master, host: str | None, notes: tuple[str, ...],
                  local_addrs: set[str]) -> Nodes:
    """torchrun's --nnodes/--node_rank/--master_addr, or one node."""
    port = master.port
    if nnodes > 1:
        if node_rank is None:
            raise UserError(f"--nnodes {nnodes} needs --node_rank on every node: 0 on the machine at "
                            f"--master_addr, 1 .. {nnodes - 1} on the others")
        check_master_addr(nnodes, master.addr)
        addr = str(master.addr)
        if node_rank == 0 and local_addrs and _is_ip(addr) and not _is_loopback(addr) \
                and addr not in local_addrs and addr != "0.0.0.0":
            raise UserError(f"--node_rank 0 runs the rendezvous at --master_addr {addr}, which is not an "
                            f"address of this machine ({', '.join(sorted(local_addrs))}); start node 0 on "
                            f"{addr} or fix --master_addr")
        if port is None:
            port = DEFAULT_MASTER_PORT
            notes += (f"--master_port {DEFAULT_MASTER_PORT} (torchrun's default)",)
    return Nodes(nnodes, node_rank or 0, master.addr, port, master.port_flag, (), host, notes)


# --- devices: --device/--nproc_per_node/--gpus/--selected_gpus/--devices --------------------------------
@dataclass(frozen=True)
class Devices:
    """What the ranks of this node run on: ``cpu`` (gloo) or ``gpu`` with one GPU id per rank."""

    device: str
    nproc_per_node: int
    devices: tuple[str, ...] = ()       # GPU ids as the launcher takes them; () on the CPU


def gpu_ids_of(ns: argparse.Namespace) -> tuple[str, tuple[str, ...]]:
    """(the flag that listed GPUs, their ids); ("", ()) when none did. The three spellings must agree."""
    given = [(flag, getattr(ns, dest)) for flag, dest in
             (("--gpus", "gpus"), ("--selected_gpus", "selected_gpus"), ("--devices", "devices"))
             if getattr(ns, dest)]
    if len({_ids(v, f) for f, v in given}) > 1:
        raise UserError(" and ".join(f"{f} {v}" for f, v in given) + " disagree; give one of them")
    return (given[0][0], _ids(given[0][1], given[0][0])) if given else ("", ())


def _ids(value: str, flag: str) -> tuple[str, ...]:
    ids = tuple(x.strip() for x in value.split(",") if x.strip())
    if not ids or not all(x.isdigit() for x in ids) or len(set(ids)) != len(ids):
        raise UserError(f"{flag} {value!r}: expected distinct GPU ids like 0,1,2,3")
    return ids


def devices_of(ns: argparse.Namespace, environ: Mapping[str, str], device_count: int | None,
               spec: LauncherSpec) -> Devices:
    """The device flags as one Devices; ``device_count`` is the GPUs this machine shows (None = cannot tell)."""
    flag, gpu_ids = gpu_ids_of(ns)
    device = (ns.device or "").strip().lower() or None
    if device is not None:
        check_device(device, shown=ns.device)
    else:
        device = "gpu" if gpu_ids or (device_count or 0) > 0 else "cpu"
    if device == "cpu":
        return _cpu_ranks(ns.nproc_per_node, flag, gpu_ids, device_count, spec)
    return _gpu_ranks(ns.nproc_per_node, flag, gpu_ids, environ, device_count)


def _cpu_ranks(nproc_text: str | None, flag: str, gpu_ids: tuple[str, ...], device_count: int | None,
               spec: LauncherSpec) -> Devices:
    check_no_gpus_on_cpu(gpu_ids, flag)
    if nproc_text in ("auto", "gpu"):
        raise UserError(f"--nproc_per_node {nproc_text}: no GPU is visible; give a number, e.g. "
                        f"--nproc_per_node 2 for 2 CPU ranks (gloo)")
    nproc = _int(nproc_text, "--nproc_per_node", "2")
    nproc = 1 if nproc is None else nproc
    if spec.cpu_ranks_take_gpus and device_count and nproc > device_count:
        raise UserError(f"--device cpu --nproc_per_node {nproc}: {spec.name} gives every rank one "
                        f"of this machine's {device_count} GPU(s), so at most {device_count} CPU ranks here")
    return Devices("cpu", nproc)


def _gpu_ranks(nproc_text: str | None, flag: str, gpu_ids: tuple[str, ...], environ: Mapping[str, str],
               device_count: int | None) -> Devices:
    labels = _visible_gpu_labels(environ)
    if gpu_ids and labels is not None:
        missing = [g for g in gpu_ids if g not in labels]
        if missing:
            raise UserError(f"{flag} {','.join(gpu_ids)}: GPU {missing[0]} is not in {E.CUDA_VISIBLE_DEVICES}="
                            f"{','.join(labels)}; Paddle's launcher takes ids as listed there")
    available = labels if labels is not None else [str(i) for i in range(device_count or 0)]
    nproc = _int(None if nproc_text in ("auto", "gpu") else nproc_text, "--nproc_per_node", "2")
    if nproc is not None:
        check_nproc(nproc)
    if gpu_ids:
        if nproc is not None:
            check_gpu_count(nproc, gpu_ids, flag)
        return Devices("gpu", len(gpu_ids), gpu_ids)
    if device_count is not None and not available:
        raise UserError("--device gpu: no GPU is visible on this machine; use --device cpu")
    if nproc is not None and device_count is not None and nproc > len(available):
        raise UserError(f"--nproc_per_node {nproc}: only {len(available)} GPU(s) are visible; use at most "
                        f"{len(available)}, or --device cpu")
    count = nproc if nproc is not None else len(available)
    if count < 1:
        raise UserError("--device gpu: cannot tell how many GPUs there are; pass --gpus 0,1,...")
    gpu_ids = tuple(available[:count]) if available else tuple(str(i) for i in range(count))
    return Devices("gpu", len(gpu_ids), gpu_ids)


# --- ports: --start_port and the variables fleetrun users set for it ------------------------------------
@dataclass(frozen=True)
class StartPort:
    """The first worker port under --ips, and who chose it."""

    port: int
    flag: str | None = None       # "--start_port" or the variable it came from; None = the launcher's default
    notes: tuple[str, ...] = ()


def start_port_of(ns: argparse.Namespace, environ: Mapping[str, str], spec: LauncherSpec) -> StartPort:
    """--start_port, else the last of the launcher's start-port variables that is set, else its default."""
    chosen = StartPort(spec.default_start_port)
    for name in spec.start_port_vars:
        value = environ.get(name)
        if value not in (None, ""):
            port = check_port(str(value), name, env_fix="--start_port")
            chosen = StartPort(port, name, (f"--start_port {port} from {name} ({spec.name} ignores that variable)",))
    if ns.start_port not in (None, ""):
        chosen = StartPort(check_port(ns.start_port, "--start_port"), "--start_port")
    return chosen


# --- restarts and patience: --rdzv-timeout/--max_restarts ------------------------------------------------
@dataclass(frozen=True)
class Restarts:
    """How long node 0 waits for the others, and how often ppmulti restarts the launch after a failure."""

    rdzv_timeout: float = DEFAULT_RDZV_TIMEOUT
    max_restarts: int | None = None   # None = never; the launcher's own restarts need an etcd master
    hang_timeout: float = DEFAULT_HANG_TIMEOUT


def restarts_of(ns: argparse.Namespace) -> Restarts:
    """--rdzv-timeout and --max_restarts read as numbers; their ranges are LaunchPlan's to check, after the
    node and device rules, so that of several mistakes the same one is reported first as before."""
    seconds = DEFAULT_RDZV_TIMEOUT
    if ns.rdzv_timeout is not None:
        try:
            seconds = float(ns.rdzv_timeout)
        except ValueError:
            raise UserError(f"--rdzv-timeout {ns.rdzv_timeout!r}: expected seconds, e.g. --rdzv-timeout 60") from None
    hang = DEFAULT_HANG_TIMEOUT
    if getattr(ns, "hang_timeout", None) is not None:
        try:
            hang = float(ns.hang_timeout)
        except ValueError:
            raise UserError(f"--hang-timeout {ns.hang_timeout!r}: expected seconds, e.g. --hang-timeout 120 "
                            f"(0 turns the watchdog off)") from None
    return Restarts(seconds, _int(ns.max_restarts, "--max_restarts", "3"), hang)


# Paddle's own launcher flags ppmulti passes on unchanged (both 2.6's and 3.3's launchers take them)
PASSED_TO_PADDLE = (("log_level", "--log_level"), ("log_overwrite", "--log_overwrite"),
                    ("enable_gpu_log", "--enable_gpu_log"))


def paddle_flags_of(ns: argparse.Namespace) -> tuple[str, ...]:
    """--run_mode checked (collective only), and the flags Paddle's launcher takes as they are."""
    mode = getattr(ns, "run_mode", None)
    if mode is not None and mode.strip().lower() != "collective":
        raise UserError(f"--run_mode {mode}: ppmulti trains collectively (data parallel, all-reduce); Paddle's "
                        f"parameter-server and other modes are not supported: drop --run_mode")
    out: list[str] = []
    for dest, flag in PASSED_TO_PADDLE:
        value = getattr(ns, dest, None)
        if value is not None:
            out += [flag, str(value)]
    return tuple(out)


def network_check_of(ns: argparse.Namespace, nnodes: int) -> float:
    """MB of the network check in the rendezvous (0: none): --network-check-mb, else the full size with
    --check-network, the quick size otherwise, none with --no-network-check or on one node."""
    from ppmulti.procs.launch.netcheck import FULL_MB, QUICK_MB

    if ns.check_network and ns.no_network_check:
        raise UserError("--check-network and --no-network-check contradict each other; give one")
    if ns.check_network and nnodes < 2:
        raise UserError("--check-network checks the links between nodes: give the nodes (--nnodes with "
                        "--master_addr, --ips, or --nodes)")
    mb = FULL_MB if ns.check_network else QUICK_MB
    if ns.network_check_mb is not None:
        try:
            mb = float(ns.network_check_mb)
        except ValueError:
            mb = -1.0
        if not 0 < mb <= 4096:
            raise UserError(f"--network-check-mb {ns.network_check_mb!r}: expected megabytes in 0..4096, "
                            f"e.g. --network-check-mb 64 (--no-network-check turns the check off)")
    return 0.0 if ns.no_network_check or nnodes < 2 else mb


def build_plan(ns: argparse.Namespace, environ: Mapping[str, str], local_addrs: set[str],
               device_count: int | None, spec: LauncherSpec | None = None,
               resolve: Resolve | None = None) -> LaunchPlan:
    """Turn parsed flags into a checked LaunchPlan; ``local_addrs`` and ``device_count`` come from the caller,
    ``spec`` (default: the installed Paddle's) says how its launcher behaves, ``resolve`` turns the host names
    a scheduler gives (SLURM's node list) into addresses (default: kept as names)."""
    spec = spec or launcher_spec()
    script, script_args = script_of(ns, spec)
    # under etcd the nodes find each other there: a scheduler's node count and rank do not apply
    ns, cluster_notes = with_cluster(ns, environ, resolve) if not _etcd_named(ns) else (ns, ())
    nodes = nodes_of(ns, environ, local_addrs) if not _etcd_named(ns) else Nodes()
    devices = devices_of(ns, environ, device_count, spec)
    start = start_port_of(ns, environ, spec)
    restarts = restarts_of(ns)
    elastic = elastic_of(ns)
    if elastic is not None:
        return _elastic_plan(ns, elastic, script, script_args, devices, start, restarts)
    return LaunchPlan(
        script=script, script_args=script_args, nproc_per_node=devices.nproc_per_node, nnodes=nodes.nnodes,
        node_rank=nodes.node_rank, master_addr=nodes.master_addr, master_port=nodes.master_port,
        master_port_flag=nodes.master_port_flag, ips=nodes.ips, host=nodes.host, device=devices.device,
        devices=devices.devices, start_port=start.port, start_port_flag=start.flag, log_dir=ns.log_dir,
        max_restarts=restarts.max_restarts, job_id=ns.job_id, rdzv_timeout=restarts.rdzv_timeout,
        verbose=bool(ns.verbose), hang_timeout=restarts.hang_timeout, rdzv_token_file=ns.rdzv_token_file,
        paddle_flags=paddle_flags_of(ns), check_network=bool(ns.check_network),
        network_check_mb=network_check_of(ns, nodes.nnodes),
        notes=(*cluster_notes, *nodes.notes, *start.notes, *_token_note(nodes.nnodes, ns.rdzv_token_file, environ),
               *(("--check-network: the nodes meet, node 0 times each link, every rank all-reduces "
                  f"{network_check_of(ns, nodes.nnodes):g} MB in place of the script, and nothing more runs",)
                 if ns.check_network else ())))


# --- elastic: --nnodes MIN:MAX on etcd (--rdzv-backend etcd --rdzv-endpoint, --master etcd://) -----------------
def _etcd_named(ns: argparse.Namespace) -> bool:
    return bool(ns.rdzv_backend or ns.rdzv_endpoint or str(ns.master or "").startswith("etcd://"))


def elastic_of(ns: argparse.Namespace):
    """The elastic launch the flags ask for (elastic.Elastic), or None; every contradiction refused by name."""
    from ppmulti.procs.launch.elastic import DEFAULT_LAST_CALL, Elastic, parse_endpoint, parse_range

    backend = (ns.rdzv_backend or "").strip().lower()
    if backend and backend != "etcd":
        why = ("torchrun's etcd-v2 backend speaks etcd's old v2 API; ppmulti uses etcd's v3 API: "
               "--rdzv-backend etcd" if backend == "etcd-v2" else
               "ppmulti runs its own rendezvous on --master_addr:--master_port; drop it, or use "
               "--rdzv-backend etcd for --nnodes MIN:MAX")
        raise UserError(f"--rdzv-backend {ns.rdzv_backend}: {why}")
    etcd_master = str(ns.master or "").startswith("etcd://")
    if ns.rdzv_endpoint and not backend:
        raise UserError(f"--rdzv-endpoint {ns.rdzv_endpoint} needs --rdzv-backend etcd (ppmulti's own rendezvous "
                        f"is named with --master_addr/--master_port)")
    if backend and not ns.rdzv_endpoint:
        raise UserError("--rdzv-backend etcd needs the address of etcd: add --rdzv-endpoint, e.g. "
                        "--rdzv-endpoint 10.0.0.1:2379")
    if backend and etcd_master:
        raise UserError(f"--master {ns.master} together with --rdzv-backend etcd: give one of them")
    if not backend and not etcd_master:
        for dest, flag in (("elastic_level", "--elastic_level"), ("elastic_timeout", "--elastic_timeout"),
                           ("rdzv_id", "--rdzv-id")):
            if getattr(ns, dest) is not None:
                raise UserError(f"{flag} applies to elastic runs on an etcd master: add --rdzv-backend etcd "
                                f"--rdzv-endpoint HOST:2379 (or --master etcd://HOST:2379), or drop {flag}")
        return None
    flag = "--master" if etcd_master else "--rdzv-endpoint"
    host, port = parse_endpoint(ns.master if etcd_master else ns.rdzv_endpoint, flag)
    for dest, shown, why in (("node_rank", "--node_rank", "node ranks follow the order the nodes register in etcd"),
                             ("ips", "--ips", "the nodes find each other in etcd"),
                             ("master_addr", "--master_addr", "node 0 is the first node registered in etcd"),
                             ("standalone", "--standalone", "an etcd master is for several nodes"),
                             ("check_network", "--check-network", "check the links with a fixed --nnodes N "
                                                                  "--master_addr run")):
        if getattr(ns, dest):
            raise UserError(f"{shown} cannot be combined with an etcd master ({why}); drop {shown}")
    if ns.nnodes is None:
        raise UserError(f"an etcd master ({flag}) needs --nnodes MIN:MAX, e.g. --nnodes 1:2")
    low, high = parse_range(ns.nnodes)
    level = None if ns.elastic_level is None else _int(ns.elastic_level, "--elastic_level", "1")
    if level is not None and level not in (0, 1):
        why = ("turns Paddle's elastic mode off: drop the etcd master for a fixed run" if level == -1
               else "expected 0 (fixed node count, restarts) or 1 (elastic node count)")
        raise UserError(f"--elastic_level {level}: {why}")
    if level == 0 and low != high:
        raise UserError(f"--elastic_level 0 keeps the node count fixed, but --nnodes {ns.nnodes} is a range; "
                        f"give --nnodes N or --elastic_level 1")
    last_call = DEFAULT_LAST_CALL
    if ns.elastic_timeout is not None:
        try:
            last_call = float(ns.elastic_timeout)
        except ValueError:
            last_call = -1.0
        if last_call < 0:
            raise UserError(f"--elastic_timeout {ns.elastic_timeout!r}: expected seconds, e.g. --elastic_timeout 10")
    return Elastic(host, port, low, high, job=ns.rdzv_id or ns.job_id or "default", last_call=last_call,
                   endpoint_flag=flag)


def _elastic_plan(ns: argparse.Namespace, elastic, script: str, script_args: tuple[str, ...], devices: Devices,
                  start: StartPort, restarts: Restarts) -> LaunchPlan:
    """One node's plan under etcd: the node count, rank and node 0 are decided per round (elastic.py)."""
    port = _port(ns.master_port, "--master_port")
    return LaunchPlan(
        script=script, script_args=script_args, nproc_per_node=devices.nproc_per_node, nnodes=1, node_rank=0,
        master_port=port, master_port_flag="--master_port" if port is not None else None, host=ns.host,
        device=devices.device, devices=devices.devices, start_port=start.port, start_port_flag=start.flag,
        log_dir=ns.log_dir, max_restarts=restarts.max_restarts, job_id=ns.job_id,
        rdzv_timeout=restarts.rdzv_timeout, verbose=bool(ns.verbose), hang_timeout=restarts.hang_timeout,
        rdzv_token_file=ns.rdzv_token_file, paddle_flags=paddle_flags_of(ns), elastic=elastic,
        network_check_mb=network_check_of(ns, elastic.max_nodes),
        notes=(f"elastic: {elastic.min_nodes} to {elastic.max_nodes} node(s) meet in etcd at {elastic.endpoint} "
               f"({elastic.endpoint_flag}), job {elastic.job!r}; each round runs as --nnodes N --node_rank R "
               f"--master_addr (the first node registered) --master_port {port or DEFAULT_MASTER_PORT}",
               "elastic: a lost node ends the round; the others go on from the last checkpoint "
               "(up to --max_restarts rounds, default 3 under etcd)", *start.notes,
               *_token_note(2, ns.rdzv_token_file, {})))


def _token_note(nnodes: int, token_file: str | None, environ: Mapping[str, str]) -> tuple[str, ...]:
    """Where the rendezvous secret comes from (a name or a path, never the secret), for --dry-run."""
    from ppmulti.procs.launch.rendezvous import token_source

    return (f"rendezvous secret: {token_source(token_file, environ)}",) if nnodes > 1 else ()


# ---------------------------------------------------------------------------------------------------------
def to_paddle(plan: LaunchPlan, spec: LauncherSpec | None = None) -> tuple[list[str], dict[str, str]]:
    """The ``python -m paddle.distributed.launch`` argv (new launcher only) and the environment to add,
    spelled as ``spec`` (default: the installed Paddle's launcher) takes them."""
    spec = spec or launcher_spec()
    argv = [sys.executable, "-m", spec.module]
    if plan.device == "gpu":
        argv += [spec.devices_flag, ",".join(plan.devices)]
    else:
        argv += [spec.nproc_flag, str(plan.nproc_per_node)]
    if plan.mode == "master":
        addr, port = plan.rdzv_endpoint  # type: ignore[misc]
        # ppmulti's rendezvous holds the master port; the launcher's HTTP rendezvous takes the next one
        argv += [spec.master_flag, f"{addr}:{port + 1}", spec.nnodes_flag, str(plan.nnodes),
                 spec.rank_flag, str(plan.node_rank)]
        if plan.host:
            argv += [spec.host_flag, plan.host]
    elif plan.mode == "ips":
        argv += [spec.ips_flag, ",".join(plan.ips), spec.host_flag, str(plan.host),
                 spec.start_port_flag, str(plan.start_port)]
    elif plan.host:
        argv += [spec.host_flag, plan.host]
    argv += list(plan.paddle_flags)
    if plan.log_dir:
        argv += [spec.log_dir_flag, plan.log_dir]
    if plan.job_id:
        argv += [spec.job_id_flag, plan.job_id]
    # --max_restarts stays with ppmulti (runner.run): the launcher's own restarts need an etcd master
    argv += [WORKER_PATH, plan.script, *plan.script_args]

    env = {E.PPMULTI_NODE_RANK: str(plan.node_rank)}
    if plan.device == "cpu":
        env.update(spec.cpu_env)
    return argv, env


def launch_env(plan: LaunchPlan, environ: Mapping[str, str]) -> tuple[dict[str, str], dict[str, str], list[str]]:
    """(full child environment, variables set or changed, variables removed) for the Paddle launcher."""
    _, changes = to_paddle(plan)
    child = E.clean_launcher_env(environ)
    child.pop(E.PPMULTI_RDZV_TOKEN, None)   # ppmulti's rendezvous is over when Paddle starts; the ranks never see it
    removed = sorted(k for k in environ if k not in child)
    child.update(changes)
    if plan.device == "gpu" and E.CUDA_DEVICE_ORDER not in environ:
        changes = {**changes, E.CUDA_DEVICE_ORDER: "PCI_BUS_ID"}   # --devices ids as nvidia-smi numbers them
        child[E.CUDA_DEVICE_ORDER] = "PCI_BUS_ID"
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
    fixed = _fixed_port_note(plan, environ, launcher_spec())
    if fixed:
        lines.append(f"# {fixed}")
    return "\n".join(lines) + "\n"


def _fixed_port_note(plan: LaunchPlan, environ: Mapping[str, str], spec: LauncherSpec) -> str | None:
    """What Paddle 3's FLAGS_FIXED_PORT does to this launch (passed through, never set by ppmulti), or None."""
    value = environ.get(E.FLAGS_FIXED_PORT)
    if value is None:
        return None
    if spec.fixed_port_var is None:
        return f"{E.FLAGS_FIXED_PORT} is read by Paddle 3.x's launcher only; {spec.name} picks free worker ports"
    if plan.mode != "master":
        return f"{E.FLAGS_FIXED_PORT} applies to --master launches only; this one ignores it"
    try:
        base = int(value) + plan.node_rank
    except ValueError:
        return f"{E.FLAGS_FIXED_PORT}={value!r} is not a port number; {spec.name} will fail on it"
    return (f"worker ports {base}..{base + plan.nproc_per_node - 1} ({E.FLAGS_FIXED_PORT} + node rank + local rank: "
            f"nodes that share a host overlap)")
