"""LaunchPlan: one launch on one node, frozen and self-checking (flags -> plan -> Paddle argv)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ppmulti.common.errors import UserError

DEFAULT_MASTER_PORT = 29500      # torchrun's default, used when --nnodes > 1 and no --master_port is given
DEFAULT_START_PORT = 6070        # Paddle 2.6's --start_port default (worker endpoints under --ips)
DEFAULT_RDZV_TIMEOUT = 300.0


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
    notes: tuple[str, ...] = field(default=(), compare=False)   # things build_plan decided, shown by --dry-run

    def __post_init__(self) -> None:
        if not self.script:
            raise UserError("no training script given: ppmulti launch [FLAGS] SCRIPT.py [SCRIPT ARGS], "
                            "e.g. ppmulti launch --nproc_per_node 2 tools/train.py -c configs/yolo.yml")
        if self.nproc_per_node < 1:
            raise UserError(f"--nproc_per_node {self.nproc_per_node}: need at least 1 process per node")
        if self.nnodes < 1:
            raise UserError(f"--nnodes {self.nnodes}: need at least 1 node")
        if not 0 <= self.node_rank < self.nnodes:
            raise UserError(f"--node_rank {self.node_rank} is out of range for --nnodes {self.nnodes}: "
                            f"use 0 .. {self.nnodes - 1}")
        if self.device not in ("cpu", "gpu"):
            raise UserError(f"--device {self.device!r}: expected cpu or gpu")
        if self.device == "gpu" and len(self.devices) != self.nproc_per_node:
            raise UserError(f"--nproc_per_node {self.nproc_per_node} disagrees with --gpus {','.join(self.devices)} "
                            f"({len(self.devices)} GPUs); give one of them")
        if self.device == "cpu" and self.devices:
            raise UserError(f"--device cpu with --gpus {','.join(self.devices)}: drop one of them")
        if self.rdzv_timeout <= 0:
            raise UserError(f"--rdzv-timeout {self.rdzv_timeout:g}: need a positive number of seconds, e.g. 300")
        if self.max_restarts is not None and self.max_restarts < 0:
            raise UserError(f"--max_restarts {self.max_restarts}: need 0 or more")
        if self.master_port is not None:
            _check_port(self.master_port, self.master_port_flag or "--master_port")
            if self.mode == "master" and self.master_port >= 65535:
                raise UserError(f"--master_port {self.master_port}: Paddle's rendezvous takes the next port, "
                                f"so use at most 65534")
        _check_port(self.start_port, self.start_port_flag or "--start_port")
        if self.start_port - 1 < 1 or self.start_port + self.nproc_per_node - 1 > 65535:
            raise UserError(f"{self.start_port_flag or '--start_port'} {self.start_port}: the ports "
                            f"{self.start_port - 1}..{self.start_port + self.nproc_per_node - 1} must all be "
                            f"valid ports (1..65535)")
        if self.ips:
            self._check_ips()
        elif self.nnodes > 1 and not self.master_addr:
            raise UserError(f"--nnodes {self.nnodes} needs --master_addr (the address of the node started with "
                            f"--node_rank 0) or --ips")

    def _check_ips(self) -> None:
        ips = ",".join(self.ips)
        if len(set(self.ips)) != len(self.ips):
            raise UserError(f"--ips {ips}: an address is listed twice")
        if len(self.ips) != self.nnodes:
            raise UserError(f"--nnodes {self.nnodes} disagrees with --ips {ips} ({len(self.ips)} nodes); drop --nnodes")
        if self.master_addr or self.master_port_flag:
            raise UserError(f"--ips {ips} together with --master_addr/--master_port: use one way to name the "
                            f"nodes (--ips, or --master_addr with --nnodes and --node_rank)")
        if len(self.ips) > 1 and "127.0.0.1" in self.ips:
            raise UserError(f"--ips {ips}: 127.0.0.1 cannot be one node of several (Paddle refuses it); "
                            f"to run several nodes on one machine use other loopback addresses, "
                            f"e.g. --ips 127.0.0.2,127.0.0.3 --host 127.0.0.2")
        if self.host not in self.ips:
            raise UserError(f"--host {self.host} is not one of --ips {ips}; pass --host with this node's "
                            f"address from the list")
        if self.ips.index(self.host) != self.node_rank:
            raise UserError(f"--node_rank {self.node_rank} disagrees with --host {self.host}, which is node "
                            f"{self.ips.index(self.host)} of --ips {ips}; drop --node_rank")

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



def _check_port(port: int, flag: str) -> None:
    if not 1 <= port <= 65535:
        raise UserError(f"{flag} {port}: not a TCP port (1..65535)")
