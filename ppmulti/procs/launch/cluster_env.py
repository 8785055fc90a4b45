"""A scheduler's node variables (SLURM's, Kubeflow's PyTorchJob and PaddleJob) -> the launch flags they imply."""

from __future__ import annotations

import argparse
import re
import socket
from dataclasses import dataclass
from typing import Callable, Mapping

from ppmulti.common import envvars as E
from ppmulti.common.errors import UserError
from ppmulti.procs.launch.plan import check_cluster_flag, check_port

# What the launch does with these variables (docs/clusters.md):
# * One ``ppmulti launch`` per node: inside an ``srun`` step with one task per node (SLURM), or in every pod of a
#   Kubeflow PyTorchJob or PaddleJob. Node count and node rank are facts of the allocation: a flag repeating them
#   must agree (anything else would wait for nodes that never come).
# * Node 0's address: the first host of the step's node list (or MASTER_ADDR), the PyTorchJob's master pod, the
#   PaddleJob's PADDLE_MASTER, resolved; the port: MASTER_PORT (PADDLE_MASTER's), else torchrun's default. These,
#   the job id and the ranks per node are defaults: the flag wins.
# * Kubeflow's training operator, read from its source (kubeflow/training-operator, pkg/controller.v1/pytorch/
#   envvar.go and master.go, paddlepaddle/envvar.go): up to v1.6.0 a PyTorchJob pod gets WORLD_SIZE = pods and
#   RANK = its index; from v1.7.0 (commit 2f18ab7) WORLD_SIZE = pods x nprocPerNode, a count of processes, beside
#   torchrun's PET_NNODES (pods), PET_NODE_RANK, PET_NPROC_PER_NODE and PET_MASTER_ADDR/PORT. The node count is
#   PET_NNODES when it is there, never a process count; a WORLD_SIZE that is not PET_NNODES x nproc is refused.
#   A PaddleJob pod gets PADDLE_NNODES, PADDLE_MASTER and PADDLE_JOB_ID but no rank: node 0 is the pod with
#   POD_IP_DUMMY (its PADDLE_MASTER is its own address), node i the pod named JOB-worker-i (HOSTNAME).
# * --standalone or --ips: the user names the nodes; the variables are not used.
# * SLURM's batch script and an salloc shell run one process on the first node only: with several nodes and no
#   node flags that is refused, pointing at ``srun --ntasks-per-node=1``.
# Everything here is pure except ``resolve``, which the command passes in.

NODE_FLAGS = ("nnodes", "node_rank", "master_addr", "master")
Resolve = Callable[[str], "str | None"]


@dataclass(frozen=True)
class Cluster:
    """This node's place as the scheduler's variables describe it (host names not yet resolved)."""

    source: str                    # "SLURM", "Kubeflow PyTorchJob", "Kubeflow PaddleJob" or "torchrun variables"
    nnodes: int
    node_rank: int | None
    master_host: str | None        # node 0's name or address
    nnodes_var: str                # where each value came from, for messages
    rank_var: str
    master_var: str
    in_step: bool = True           # False: SLURM's batch script or an salloc shell (one process, first node)
    tasks: int | None = None       # tasks of the srun step
    this_host: str | None = None   # this node's name
    master_port: int | None = None
    job_id: str | None = None
    gpus: int | None = None        # GPUs the scheduler gave this node
    gpus_var: str = E.SLURM_GPUS_ON_NODE
    job_var: str = E.SLURM_JOB_ID
    port_var: str = E.MASTER_PORT
    nproc: int | None = None       # ranks per node the job asks for (a PyTorchJob's nprocPerNode)
    nproc_var: str = E.PET_NPROC_PER_NODE


# --- SLURM's hostlist syntax ----------------------------------------------------------------------------------
_PART = re.compile(r"\[([^\[\]]*)\]")


def expand_hostlist(text: str) -> list[str]:
    """Host names of a SLURM hostlist, in order, as ``scontrol show hostnames`` lists them: ``n[1-2,5]``,
    zero-padded ranges (``a[01-03]``), several bracket groups (cartesian, the last varying fastest), comma and
    space separated entries. A suffix after the last bracket (``a[01-03]b``), which Slurm 22.05 refuses, is kept
    on every name."""
    hosts: list[str] = []
    for entry in _split_top(text):
        names = [""]
        pos = 0
        for match in _PART.finditer(entry):
            literal = entry[pos:match.start()]
            names = [n + literal + v for n in names for v in _range_values(match.group(1), text)]
            pos = match.end()
        rest = entry[pos:]
        if "[" in rest or "]" in rest:
            raise UserError(f"node list {text!r}: unbalanced brackets; expected names like n[1-2,5]")
        hosts += [n + rest for n in names]
    return hosts


def _split_top(text: str) -> list[str]:
    """Entries separated by commas or spaces outside brackets."""
    entries, depth, current = [], 0, ""
    for ch in text:
        depth += ch == "["
        depth -= ch == "]"
        if depth == 0 and ch in ", \t\n":
            entries.append(current)
            current = ""
        else:
            current += ch
    entries.append(current)
    return [e for e in entries if e]


def _range_values(body: str, text: str) -> list[str]:
    values = []
    for item in body.split(","):
        low, _, high = item.strip().partition("-")
        if not low.isdigit() or (high and not high.isdigit()) or (high and int(high) < int(low)):
            raise UserError(f"node list {text!r}: {item.strip()!r} is not a number or a rising range like 1-4")
        width = len(low)   # SLURM pads every value to the low bound's width: 098-101 -> 098 099 100 101
        values += [str(i).zfill(width) for i in range(int(low), int(high or low) + 1)]
    return values


# --- reading the variables ------------------------------------------------------------------------------------
def _number(environ: Mapping[str, str], name: str) -> int | None:
    value = (environ.get(name) or "").strip()
    if not value:
        return None
    if not value.isdigit():
        raise UserError(f"{name}={value} in the environment is not a whole number; fix or unset it")
    return int(value)


def cluster_of(environ: Mapping[str, str]) -> Cluster | None:
    """SLURM's variables, else a Kubeflow PaddleJob's, else a PyTorchJob's (torchrun's names), else None. Inside a
    launcher's worker (Paddle's ids, or torchrun's LOCAL_RANK) they describe that launch, not this node: None."""
    if E.in_paddle_worker(environ) or E.LOCAL_RANK in environ:
        return None
    if environ.get(E.SLURM_JOB_ID) and environ.get(E.SLURM_NNODES):
        return _slurm(environ)
    if environ.get(E.PADDLE_NNODES) and environ.get(E.PADDLE_MASTER):
        return _paddlejob(environ)
    if environ.get(E.PET_NNODES):
        return _pytorchjob(environ)
    if environ.get(E.WORLD_SIZE):
        # torchrun's names alone: Kubeflow's operator up to v1.6.0 (WORLD_SIZE = pods), or a user's own
        master = environ.get(E.MASTER_ADDR) or None
        return Cluster(source="torchrun variables", nnodes=_number(environ, E.WORLD_SIZE) or 1,
                       node_rank=_number(environ, E.RANK), master_host=master,
                       nnodes_var=E.WORLD_SIZE, rank_var=E.RANK, master_var=E.MASTER_ADDR,
                       master_port=_master_port(environ), job_id=_job_of_master(master), job_var=E.MASTER_ADDR)
    return None


def _pytorchjob(environ: Mapping[str, str]) -> Cluster:
    """A PyTorchJob pod of Kubeflow's training operator v1.7.0 or later: PET_NNODES is the pod count."""
    text = environ[E.PET_NNODES].strip()
    low, colon, high = text.partition(":")
    if colon:
        if not (low.isdigit() and high.isdigit()):
            raise UserError(f"{E.PET_NNODES}={text} in the environment is not a node count or MIN:MAX; fix or unset it")
        if low != high:
            raise UserError(f"{E.PET_NNODES}={text}: an elastic PyTorchJob (elasticPolicy with minReplicas "
                            f"{low} < maxReplicas {high}) meets in etcd with ppmulti: give the pods "
                            f"ppmulti launch --nnodes {low}:{high} --rdzv-backend etcd --rdzv-endpoint HOST:2379, "
                            f"or drop the elasticPolicy (or give it minReplicas = maxReplicas)")
        text = low
    nnodes = _number({E.PET_NNODES: text}, E.PET_NNODES) or 1
    rank = _number(environ, E.PET_NODE_RANK)
    rank_var = E.PET_NODE_RANK
    torch_rank = _number(environ, E.RANK)
    if rank is None:
        rank, rank_var = torch_rank, E.RANK
    elif torch_rank is not None and torch_rank != rank:
        raise UserError(f"{E.RANK}={torch_rank} and {E.PET_NODE_RANK}={rank} disagree; a PyTorchJob pod gets the "
                        f"same value in both (its index), so one was set by hand: fix or unset it")
    nproc_text = (environ.get(E.PET_NPROC_PER_NODE) or "").strip()
    nproc = int(nproc_text) if nproc_text.isdigit() else None
    world = _number(environ, E.WORLD_SIZE)
    # the operator's own rule (getNprocPerNodeInt): "auto" or no nprocPerNode counts as 1 process per pod
    expected = nnodes * (nproc or 1)
    if world is not None and world != expected:
        per = f"{E.PET_NPROC_PER_NODE}={nproc_text}" if nproc_text else f"no {E.PET_NPROC_PER_NODE} (1)"
        raise UserError(f"{E.WORLD_SIZE}={world} disagrees with {E.PET_NNODES}={nnodes} x {per} = {expected} "
                        f"processes, as Kubeflow's training operator sets them; fix or unset {E.WORLD_SIZE}")
    addr_var = E.PET_MASTER_ADDR if environ.get(E.PET_MASTER_ADDR) else E.MASTER_ADDR
    port_var = E.PET_MASTER_PORT if environ.get(E.PET_MASTER_PORT) else E.MASTER_PORT
    port = environ.get(port_var)
    if nnodes > 1 and rank is None:
        raise UserError(f"{E.PET_NNODES}={nnodes} but no {E.PET_NODE_RANK} or {E.RANK}: a PyTorchJob without a "
                        f"Master replica gives its pods no rank; add a Master replica (replicas: 1), "
                        f"or pass --node_rank")
    master = environ.get(addr_var) or None
    return Cluster(source="Kubeflow PyTorchJob", nnodes=nnodes, node_rank=rank,
                   master_host=master, nnodes_var=E.PET_NNODES, rank_var=rank_var,
                   master_var=addr_var, this_host=environ.get(E.HOSTNAME) or None,
                   master_port=None if port in (None, "") else check_port(port, port_var, env_fix="--master_port"),
                   port_var=port_var, nproc=nproc, job_id=_job_of_master(master), job_var=addr_var)


def _job_of_master(master: str | None) -> str | None:
    """A PyTorchJob's name from its master pod's, JOB-master-0 (replicaName in the operator's envvar.go): Paddle's
    log names and the rendezvous key then differ between jobs."""
    named = re.fullmatch(r"(.+)-master-0", master or "")
    return named.group(1) if named else None


def _paddlejob(environ: Mapping[str, str]) -> Cluster:
    """A PaddleJob pod (collective mode: Worker replicas only). Paddle's own launcher finds the node ranks in its
    HTTP rendezvous; ppmulti's needs them before it, so they come from the pods' names."""
    if environ.get(E.PADDLE_SERVER_NUM) or environ.get(E.PADDLE_TRAINER_NUM):
        raise UserError(f"this PaddleJob has a Master replica, which runs Paddle's parameter-server mode "
                        f"({E.PADDLE_SERVER_NUM}/{E.PADDLE_TRAINER_NUM} are set); ppmulti trains collectively: "
                        f"give the job Worker replicas only")
    master = environ[E.PADDLE_MASTER].strip()
    host, colon, port = master.rpartition(":")
    if not colon or not host:
        raise UserError(f"{E.PADDLE_MASTER}={master} in the environment is not HOST:PORT; fix or unset it")
    job = (environ.get(E.PADDLE_JOB_ID) or "").strip() or None
    this = environ.get(E.HOSTNAME) or None
    rank: int | None = None
    rank_var = E.HOSTNAME                  # the pod's name, JOB-worker-N
    if (environ.get(E.POD_IP_DUMMY) or "").strip() == host:
        rank, rank_var = 0, E.POD_IP_DUMMY  # only node 0's pod has it: its own address, as its PADDLE_MASTER
    elif job and this:
        match = re.fullmatch(re.escape(job) + r"-worker-(\d+)", this.strip())
        rank = int(match.group(1)) if match else None
    return Cluster(source="Kubeflow PaddleJob", nnodes=_number(environ, E.PADDLE_NNODES) or 1, node_rank=rank,
                   master_host=host, nnodes_var=E.PADDLE_NNODES, rank_var=rank_var, master_var=E.PADDLE_MASTER,
                   this_host=this, master_port=check_port(port, E.PADDLE_MASTER, env_fix="--master_port"),
                   port_var=E.PADDLE_MASTER, job_id=job, job_var=E.PADDLE_JOB_ID)


def _slurm(environ: Mapping[str, str]) -> Cluster:
    step = environ.get(E.SLURM_STEP_ID)
    in_step = step is not None
    nnodes_var = E.SLURM_STEP_NUM_NODES if in_step and environ.get(E.SLURM_STEP_NUM_NODES) else E.SLURM_NNODES
    list_var = E.SLURM_STEP_NODELIST if in_step and environ.get(E.SLURM_STEP_NODELIST) else E.SLURM_JOB_NODELIST
    hosts = expand_hostlist(environ.get(list_var) or "")
    job = environ.get(E.SLURM_JOB_ID)
    return Cluster(source="SLURM", nnodes=_number(environ, nnodes_var) or 1, node_rank=_number(environ, E.SLURM_NODEID),
                   master_host=environ.get(E.MASTER_ADDR) or (hosts[0] if hosts else None),
                   nnodes_var=nnodes_var, rank_var=E.SLURM_NODEID,
                   master_var=E.MASTER_ADDR if environ.get(E.MASTER_ADDR) else list_var,
                   in_step=in_step, tasks=_number(environ, E.SLURM_STEP_NUM_TASKS) if in_step else None,
                   this_host=environ.get(E.SLURMD_NODENAME) or None, master_port=_master_port(environ),
                   job_id=f"slurm-{job}-{step}" if in_step else f"slurm-{job}",
                   gpus=_number(environ, E.SLURM_GPUS_ON_NODE))


def _master_port(environ: Mapping[str, str]) -> int | None:
    value = environ.get(E.MASTER_PORT)
    return None if value in (None, "") else check_port(value, E.MASTER_PORT, env_fix="--master_port")


# --- the flags they imply -------------------------------------------------------------------------------------
def resolve(name: str) -> str | None:
    """``name``'s IPv4 address (Paddle's launcher compares node addresses as IPv4), or None."""
    try:
        infos = socket.getaddrinfo(name, None, socket.AF_INET, socket.SOCK_STREAM)
    except OSError:
        return None
    return str(infos[0][4][0]) if infos else None


def with_cluster(ns: argparse.Namespace, environ: Mapping[str, str],
                 resolve: Resolve | None = None) -> tuple[argparse.Namespace, tuple[str, ...]]:
    """(``ns`` with what the scheduler's variables imply filled in where no flag was given, notes for --dry-run).
    ``resolve`` turns host names into addresses (default: names are kept as they are)."""
    cluster = cluster_of(environ)
    if cluster is None:
        return ns, ()
    if ns.standalone or ns.ips:
        return ns, (f"{cluster.source} variables not used: {'--standalone' if ns.standalone else '--ips'} "
                    f"names the nodes",)
    if not cluster.in_step:
        if cluster.nnodes > 1 and not any(getattr(ns, f) for f in NODE_FLAGS):
            raise UserError(f"this is SLURM's batch script or salloc shell: one process on one of the job's "
                            f"{cluster.nnodes} nodes, so the others would never join; start one launch per node "
                            f"with srun --ntasks-per-node=1 ppmulti launch ..., or pass --nnodes 1 for this node alone")
        return ns, ()
    if cluster.nnodes > 1 and cluster.tasks is not None and cluster.tasks != cluster.nnodes:
        raise UserError(f"srun started {cluster.tasks} tasks on {cluster.nnodes} nodes; ppmulti launch starts the "
                        f"ranks itself and wants one task per node: srun --ntasks-per-node=1 ppmulti launch ...")
    out = argparse.Namespace(**vars(ns))
    notes: list[str] = []
    _fact(out, "nnodes", "--nnodes", cluster.nnodes, cluster.nnodes_var, notes)
    if cluster.node_rank is not None:
        _fact(out, "node_rank", "--node_rank", cluster.node_rank, cluster.rank_var, notes)
    elif cluster.nnodes > 1 and ns.node_rank is None and cluster.source == "Kubeflow PaddleJob":
        raise UserError(f"{cluster.source} of {cluster.nnodes} pods: this pod's index is unknown ({E.HOSTNAME}="
                        f"{cluster.this_host or ''} is not {cluster.job_id or 'JOB'}-worker-N); pass --node_rank")
    if cluster.nnodes > 1 and cluster.master_host and not (ns.master_addr or ns.master):
        out.master_addr = _address(cluster.master_host, cluster.master_var, resolve)
        notes.append(f"--master_addr {out.master_addr}: {cluster.master_host} from {cluster.master_var}")
        if ns.host is None and not environ.get(E.POD_IP):
            out.host = _this_host(cluster, out.master_addr, resolve)
            if out.host:
                notes.append(f"--host {out.host}: this node's address")
    if cluster.master_port is not None and ns.master_port is None and not ns.master:
        out.master_port = str(cluster.master_port)
        notes.append(f"--master_port {cluster.master_port} from {cluster.port_var}")
    if cluster.job_id and ns.job_id is None:
        out.job_id = cluster.job_id
        notes.append(f"--job_id {cluster.job_id} from {cluster.job_var}")
    no_ids = not (ns.gpus or ns.selected_gpus or ns.devices)
    if cluster.nproc and ns.nproc_per_node is None and no_ids:
        out.nproc_per_node = str(cluster.nproc)
        notes.append(f"--nproc_per_node {cluster.nproc} from {cluster.nproc_var}")
    elif cluster.gpus and ns.nproc_per_node is None and no_ids and (ns.device or "").strip().lower() != "cpu":
        out.nproc_per_node = str(cluster.gpus)
        notes.append(f"--nproc_per_node {cluster.gpus} from {cluster.gpus_var}")
    return out, tuple(notes)


def _fact(out: argparse.Namespace, dest: str, flag: str, value: int, var: str, notes: list[str]) -> None:
    """A value the allocation fixes: taken from ``var``, or checked against the flag that repeats it."""
    given = getattr(out, dest)
    if given is None:
        setattr(out, dest, str(value))
        notes.append(f"{flag} {value} from {var}")
    elif str(given).strip().isdigit():
        check_cluster_flag(flag, int(str(given).strip()), var, value)


def _address(name: str, var: str, resolve: Resolve | None) -> str:
    if resolve is None:
        return name
    addr = resolve(name)
    if addr is None:
        raise UserError(f"{name} (node 0, from {var}) does not resolve to an IPv4 address here; "
                        f"pass --master_addr with node 0's address")
    return addr


def _this_host(cluster: Cluster, master_addr: str, resolve: Resolve | None) -> str | None:
    """Node 0 is at the master address by definition (Paddle's launcher serves its rendezvous only when its own
    address equals it); another node's own name, resolved, when the scheduler names it."""
    if cluster.node_rank == 0:
        return master_addr
    if cluster.this_host and resolve is not None:
        return resolve(cluster.this_host)
    return None
