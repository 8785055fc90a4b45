"""LaunchPlan: one launch on one node, frozen and self-checking, and the one home of every check it makes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ppmulti.common.compat import launcher_spec
from ppmulti.common.errors import UserError

DEFAULT_MASTER_PORT = 29500      # torchrun's default, used when --nnodes > 1 and no --master_port is given
DEFAULT_START_PORT = launcher_spec().default_start_port   # the installed Paddle launcher's --start_port default
DEFAULT_RDZV_TIMEOUT = 300.0
DEFAULT_HANG_TIMEOUT = 300.0    # the hang watchdog (procs/launch/watchdog.py): a few minutes of no progress
PORTS = range(1, 65536)          # what a TCP port number may be

# Each check_* below owns one rule about a launch and its one-line message. The flag builders (flags.py) call
# them as soon as their values exist, so the first problem in the user's flags is the one reported;
# LaunchPlan.__post_init__ calls them all, so a plan made any other way is held to the same rules.


def check_port(value: int | str, flag: str, example: str = "29500", *, span: tuple[int, int] = (0, 0),
               why: str = "", env_fix: str | None = None) -> int:
    """The TCP port that ``value`` (a flag's text or a number) names, for every caller that takes a port.

    ``span`` = (low, high): the launch also uses the ports ``port + low .. port + high`` (said by ``why``),
    which must be ports too. ``env_fix``: ``flag`` is an environment variable, and ``env_fix`` the flag to
    pass instead of it.
    """
    text = str(value).strip()
    try:
        port: int | None = int(text)
    except ValueError:
        port = None
    if env_fix is not None:
        # a variable set long ago in a shell profile: say where it is, not only what is wrong
        if port is None or not text.isdigit() or port not in PORTS:
            raise UserError(f"{flag}={value} in the environment is not a TCP port (1..65535); fix or unset it, "
                            f"or pass {env_fix}")
    e_g = f", e.g. {flag} {example}" if flag.startswith("-") else ""
    if port is None or port not in PORTS:
        raise UserError(f"{flag} {text}: not a TCP port (1..65535){e_g}")
    low, high = span
    if port + low not in PORTS or port + high not in PORTS:
        raise UserError(f"{flag} {port}: {why}, so use {PORTS.start - low}..{PORTS.stop - 1 - high}{e_g}")
    return port


def check_script(script: str | None, suffix: str) -> str:
    """The training script: given, and a file Paddle's launcher runs with Python (its name ends in ``suffix``)."""
    if not script:
        raise UserError("no training script given: ppmulti launch [FLAGS] SCRIPT.py [SCRIPT ARGS], "
                        "e.g. ppmulti launch --nproc_per_node 2 tools/train.py -c configs/yolo.yml")
    if not script.endswith(suffix):
        raise UserError(f"{script}: ppmulti launch runs Python scripts; pass the path of a {suffix} file")
    return script


def check_nproc(nproc: int) -> int:
    if nproc < 1:
        raise UserError(f"--nproc_per_node {nproc}: need at least 1 process per node")
    return nproc


def check_device(device: str, shown: str | None = None) -> str:
    """``cpu`` or ``gpu``; ``shown`` is the text the user typed, when it was normalised first."""
    if device not in ("cpu", "gpu"):
        raise UserError(f"--device {shown if shown is not None else device!r}: expected cpu or gpu")
    return device


def check_gpu_count(nproc: int, gpus: tuple[str, ...], flag: str = "--gpus") -> None:
    """One rank per listed GPU: ``--nproc_per_node`` and the GPU list (given with ``flag``) must agree."""
    if nproc != len(gpus):
        raise UserError(f"--nproc_per_node {nproc} disagrees with {flag} {','.join(gpus)} ({len(gpus)} GPUs); "
                        f"give one of them")


def check_no_gpus_on_cpu(gpus: tuple[str, ...], flag: str = "--gpus") -> None:
    if gpus:
        raise UserError(f"--device cpu with {flag} {','.join(gpus)}: drop one of them")


def check_node_rank(nnodes: int, node_rank: int) -> None:
    if nnodes < 1:
        raise UserError(f"--nnodes {nnodes}: need at least 1 node")
    if not 0 <= node_rank < nnodes:
        raise UserError(f"--node_rank {node_rank} is out of range for --nnodes {nnodes}: use 0 .. {nnodes - 1}")


def check_master_addr(nnodes: int, master_addr: str | None) -> None:
    """Several nodes without --ips meet at node 0's address."""
    if nnodes > 1 and not master_addr:
        raise UserError(f"--nnodes {nnodes} needs --master_addr (the address of the node started with "
                        f"--node_rank 0), e.g. --master_addr 10.0.0.1")


def check_ips_once(ips: tuple[str, ...]) -> None:
    if len(set(ips)) != len(ips):
        raise UserError(f"--ips {','.join(ips)}: an address is listed twice")


def check_ips(ips: tuple[str, ...], nnodes: int, master_addr: str | None, master_port_flag: str | None) -> None:
    """fleetrun's --ips: the only way the nodes are named, as many as --nnodes says, 127.0.0.1 only alone."""
    listed = ",".join(ips)
    if master_addr or master_port_flag:
        raise UserError(f"--ips {listed} together with --master_addr/--master_port: use one way to name the "
                        f"nodes (--ips, or --master_addr with --nnodes and --node_rank)")
    if nnodes != len(ips):
        raise UserError(f"--nnodes {nnodes} disagrees with --ips {listed} ({len(ips)} nodes); drop --nnodes")
    if len(ips) > 1 and "127.0.0.1" in ips:
        # Paddle's launcher refuses it ("127.0.0.1 in ips is not allowed in multi-nodes")
        raise UserError(f"--ips {listed}: 127.0.0.1 cannot be one node of several (Paddle refuses it); "
                        f"to run several nodes on one machine use other loopback addresses, "
                        f"e.g. --ips 127.0.0.2,127.0.0.3 --host 127.0.0.2")


def check_host_in_ips(ips: tuple[str, ...], host: str | None, origin: str = "--host") -> str:
    """This node's address is one of --ips (Paddle's launcher would silently act as node 0 otherwise);
    ``origin`` names where ``host`` came from: ``--host`` or the variable that set it."""
    if host not in ips:
        raise UserError(f"{origin} {host} is not one of --ips {','.join(ips)}; pass --host with this node's "
                        f"address from the list")
    return str(host)


def check_node_rank_in_ips(ips: tuple[str, ...], host: str, node_rank: int) -> None:
    """Under --ips the node rank is the position of --host; a --node_rank given as well must agree."""
    if ips.index(host) != node_rank:
        raise UserError(f"--node_rank {node_rank} disagrees with --host {host}, which is node "
                        f"{ips.index(host)} of --ips {','.join(ips)}; drop --node_rank")


def check_cluster_flag(flag: str, given: int, var: str, value: int) -> None:
    """A flag repeating what the scheduler fixed (how many nodes, which one this is) must agree with it:
    a different one would wait for nodes that never come."""
    if given != value:
        raise UserError(f"{flag} {given} disagrees with {var}={value} set by the scheduler; drop {flag}")


def check_max_restarts(max_restarts: int | None) -> None:
    if max_restarts is not None and max_restarts < 0:
        raise UserError(f"--max_restarts {max_restarts}: need 0 or more")


def check_rdzv_timeout(seconds: float) -> None:
    if seconds <= 0:
        raise UserError(f"--rdzv-timeout {seconds:g}: need a positive number of seconds, e.g. 300")


def check_hang_timeout(seconds: float) -> None:
    if seconds < 0:
        raise UserError(f"--hang-timeout {seconds:g}: need 0 (off) or a number of seconds, e.g. 300")


def check_master_port(value: int | str, flag: str = "--master_port", mode: str = "master") -> int:
    """Node 0's port; in master mode Paddle's HTTP rendezvous takes the next port as well."""
    example = "10.0.0.1:29500" if flag == "--master" else "29500"
    if mode != "master":
        return check_port(value, flag, example)
    return check_port(value, flag, example, span=(0, 1), why="Paddle's rendezvous takes the next port")


def check_start_port(value: int | str, flag: str, nproc: int) -> int:
    """The first worker port under --ips: ppmulti's rendezvous takes the port below, the ranks the ones from it."""
    return check_port(value, flag, "17000", span=(-1, nproc - 1),
                      why=f"ppmulti's rendezvous takes the port below and the {nproc} local rank(s) the ports from it")


@dataclass(frozen=True)
class LaunchPlan:
    """Everything one ``ppmulti launch`` on one node needs; ``mode`` says which of Paddle's launch modes.

    * ``single``: one node; Paddle picks every port (``--master_port`` is only checked to be free).
    * ``master``: torchrun style ``--master_addr/--master_port/--nnodes/--node_rank``; ppmulti's own
      rendezvous on ``master_port``, Paddle's HTTP rendezvous on ``master_port + 1``.
    * ``ips``: fleetrun style ``--ips``; node rank is the position of ``host`` in ``ips``; workers use
      ``start_port ...`` and ppmulti's rendezvous uses ``start_port - 1`` on ``ips[0]``.
    """

    script: str
    script_args: tuple[str, ...] = ()
    nproc_per_node: int = 1
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str | None = None
    master_port: int | None = None
    master_port_flag: str | None = None   # how the user named the master port ("--master_port"), None = default
    ips: tuple[str, ...] = ()
    host: str | None = None
    device: str = "cpu"                   # "cpu" (gloo) or "gpu"
    devices: tuple[str, ...] = ()         # GPU ids as Paddle's --devices takes them
    start_port: int = DEFAULT_START_PORT
    start_port_flag: str | None = None    # "--start_port", "FLAGS_START_PORT", "PADDLE_START_PORT" or None
    log_dir: str | None = None
    max_restarts: int | None = None
    job_id: str | None = None
    rdzv_timeout: float = DEFAULT_RDZV_TIMEOUT
    rdzv_token_file: str | None = None    # the rendezvous secret's file (rendezvous.py); None: PPMULTI_RDZV_TOKEN
    paddle_flags: tuple[str, ...] = ()    # Paddle's own flags passed on as given (--log_level DEBUG, ...)
    check_network: bool = False           # --check-network: the rendezvous and its network check, then stop
    network_check_mb: float = 0.0         # MB node 0 sends each node in the rendezvous to time its link; 0: none
    verbose: bool = False                 # all of Paddle's launcher output on the console (procs/launch/console.py)
    hang_timeout: float = DEFAULT_HANG_TIMEOUT   # seconds without progress before the watchdog fires; 0: off
    elastic: Any = None                   # elastic.Elastic: --nnodes MIN:MAX on etcd, rounds agreed there
    notes: tuple[str, ...] = field(default=(), compare=False)   # things build_plan decided, shown by --dry-run

    def __post_init__(self) -> None:
        check_script(self.script, launcher_spec().script_suffix)
        check_nproc(self.nproc_per_node)
        check_node_rank(self.nnodes, self.node_rank)
        check_device(self.device)
        if self.device == "gpu":
            check_gpu_count(self.nproc_per_node, self.devices)
        else:
            check_no_gpus_on_cpu(self.devices)
        check_rdzv_timeout(self.rdzv_timeout)
        check_max_restarts(self.max_restarts)
        check_hang_timeout(self.hang_timeout)
        if self.master_port is not None:
            check_master_port(self.master_port, self.master_port_flag or "--master_port", self.mode)
        check_start_port(self.start_port, self.start_port_flag or "--start_port", self.nproc_per_node)
        if self.ips:
            check_ips_once(self.ips)
            check_ips(self.ips, self.nnodes, self.master_addr, self.master_port_flag)
            check_node_rank_in_ips(self.ips, check_host_in_ips(self.ips, self.host), self.node_rank)
        else:
            check_master_addr(self.nnodes, self.master_addr)

    @property
    def mode(self) -> str:
        if self.ips:
            return "ips"
        return "master" if self.nnodes > 1 else "single"

    @property
    def world_size(self) -> int:
        return self.nproc_per_node * self.nnodes

    @property
    def rdzv_endpoint(self) -> tuple[str, int] | None:
        """Where ppmulti's own node rendezvous listens (node 0), or None for a single node."""
        if self.mode == "master":
            return str(self.master_addr), int(self.master_port or DEFAULT_MASTER_PORT)
        if self.mode == "ips" and len(self.ips) > 1:
            return self.ips[0], self.start_port - 1
        return None
