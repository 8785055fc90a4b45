"""Elastic node counts on an etcd master: membership by lease, one agreed round per launch attempt, resume on fewer.

Why not Paddle's own etcd path. ``python -m paddle.distributed.launch --master etcd://... --nnodes 1:2`` needs the
``etcd3`` client (0.12.0 on PyPI), whose generated protobuf code fails under the protobuf Paddle 3.3 installs
(``TypeError: Descriptors cannot be created directly``; it runs only with
``PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION=python``). With that, on CPU/gloo two loopback nodes form a world of 2; after
one node is SIGKILLed, Paddle 3.3.1 restarts the survivor's rank as a world of 1, where ``init_parallel_env`` does
nothing on the CPU and the first collective fails (``RuntimeError: The global group is not initialized.``), and
the launcher then waits for peers ("Waiting peer ready...") until it is stopped. Nor does it resume from a
checkpoint: that is the script's business. On Paddle 2.6.2 the same launch died at start with SIGSEGV in
``inflateReset2`` (the zlib clash of docs/stacks.md). So ppmulti keeps Paddle's launcher for what it does well
(one fixed world) and uses etcd only for what etcd is for: who is alive.

How. Every node talks to etcd's v3 JSON gateway over HTTP (``/v3/lease/grant``, ``/v3/kv/put``, ``/v3/kv/range``,
``/v3/kv/txn``, ``/v3/lease/keepalive``) with urllib: no new dependency, nothing that pins protobuf. Under
``/ppmulti/elastic/<job>/``:

* ``members/<node>``: each node's registration (host, ranks), held by a lease of ``LEASE_TTL`` seconds that a
  thread keeps alive. A node whose process died disappears within ``LEASE_TTL``; the registration order
  (etcd's create revision) orders the node ranks.
* ``ready/<k>/<node>``: the node is between launches and wants to be in round ``k`` (same lease).
* ``round/<k>``: the members of round ``k`` in rank order, written once (a create-if-absent transaction) by the
  first ready node, when MAX nodes are ready, or every live member is ready and at least MIN are (a restart),
  or MIN are ready and ``--elastic_timeout`` has passed since (the first round waits that long for more); never
  while a live member of round ``k-1`` still runs it.
* ``finished/<k>/<node>``: the node's ranks ended round ``k`` well; its leaving then ends nothing.
* ``run_dir``: the run directory a restart continues, for nodes that join later.
* ``done``: the run finished; a later launch with the same job id is refused.

Each round is an ordinary master-mode launch (``runner._attempt``: ppmulti's rendezvous, Paddle's launcher,
the watchdog) with ``PPMULTI_RESTART=k``, so a training started by ppmulti resumes from its last checkpoint
with the same effective batch on the new world size (``hooks/resume.py``). While a round runs, each node checks
etcd every second and ends its launch when a member's lease is gone or a member is already waiting for the
next round. A node that joins while a round runs waits for the next round (the next restart); it is taken in
then, and continues the same run (``run_dir``: the run directory the first round's nodes started).
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import socket
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass, replace
from typing import Any, Callable, Mapping, TextIO

from ppmulti.common.errors import UserError
from ppmulti.procs.launch.result import Launch, LaunchState

LEASE_TTL = 10            # seconds a dead node stays a member; the time a survivor may wait for it to vanish
DEFAULT_LAST_CALL = 30.0  # Paddle's --elastic_timeout default: how long the first round waits for more than MIN
DEFAULT_ELASTIC_RESTARTS = 3   # Paddle's --max_restart default, which applies under etcd
POLL = 0.5
PREFIX = "/ppmulti/elastic/"


@dataclass(frozen=True)
class Elastic:
    """An elastic launch: the etcd endpoint, the node range, the job, and how long to wait for more nodes."""

    etcd_host: str
    etcd_port: int
    min_nodes: int
    max_nodes: int
    job: str = "default"
    last_call: float = DEFAULT_LAST_CALL
    endpoint_flag: str = "--rdzv-endpoint"

    def __post_init__(self) -> None:
        check_range(self.min_nodes, self.max_nodes)

    @property
    def endpoint(self) -> str:
        return f"{self.etcd_host}:{self.etcd_port}"


def check_range(low: int, high: int, shown: str | None = None) -> None:
    text = shown or f"{low}:{high}"
    if low < 1:
        raise UserError(f"--nnodes {text}: need at least 1 node")
    if low > high:
        raise UserError(f"--nnodes {text}: MIN {low} is more than MAX {high}; give MIN:MAX, e.g. --nnodes 1:{low}")


def parse_range(text: str) -> tuple[int, int]:
    """``MIN:MAX`` (torchrun's and Paddle's spelling) or ``N`` -> (min, max)."""
    low, sep, high = str(text).strip().partition(":")
    try:
        lo, hi = int(low), int(high if sep else low)
    except ValueError:
        raise UserError(f"--nnodes {text!r}: expected N or MIN:MAX, e.g. --nnodes 1:2") from None
    check_range(lo, hi, str(text).strip())
    return lo, hi


def parse_endpoint(text: str, flag: str) -> tuple[str, int]:
    """``host:port`` (``etcd://`` or ``http://`` allowed in front); etcd's client port 2379 when none is given."""
    from ppmulti.procs.launch.plan import check_port

    rest = str(text).strip()
    for scheme in ("etcd://", "http://"):
        if rest.startswith(scheme):
            rest = rest[len(scheme):]
    rest = rest.split(",")[0].rstrip("/")
    host, sep, port = rest.rpartition(":")
    if not sep:
        host, port = rest, "2379"
    if not host:
        raise UserError(f"{flag} {text!r}: expected HOST:PORT of etcd, e.g. {flag} 10.0.0.1:2379")
    return host, check_port(port, flag, "10.0.0.1:2379")


# --- etcd's v3 JSON gateway ------------------------------------------------------------------------------------
def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def _unb64(text: str) -> str:
    return base64.b64decode(text).decode()


def _prefix_end(prefix: str) -> str:
    raw = bytearray(prefix.encode())
    raw[-1] += 1
    return base64.b64encode(bytes(raw)).decode()


class Etcd:
    """The few v3 calls this needs, as JSON over HTTP (etcd 3.4+ serves them on its client port)."""

    def __init__(self, host: str, port: int, flag: str = "--rdzv-endpoint", timeout: float = 5.0):
        self.base = f"http://{host}:{port}"
        self.where = f"etcd at {host}:{port} ({flag})"
        self.timeout = timeout

    def call(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        request = urllib.request.Request(self.base + path, data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as answer:
                return json.loads(answer.read() or b"{}")
        except urllib.error.HTTPError as exc:
            raise UserError(f"{self.where} refused {path}: HTTP {exc.code} {exc.read()[:200]!r}") from None
        except (urllib.error.URLError, OSError, ValueError) as exc:
            reason = getattr(exc, "reason", exc)
            raise UserError(f"{self.where} is not reachable: {reason}; start etcd there or fix the endpoint") from None

    def check(self) -> str:
        """etcd's version; a UserError naming the endpoint when it does not answer as etcd v3."""
        try:
            with urllib.request.urlopen(self.base + "/version", timeout=self.timeout) as answer:
                version = json.loads(answer.read()).get("etcdserver", "?")
        except (urllib.error.URLError, OSError, ValueError) as exc:
            reason = getattr(exc, "reason", exc)
            raise UserError(f"{self.where} is not reachable: {reason}; start etcd there or fix the endpoint") from None
        self.call("/v3/kv/range", {"key": _b64(PREFIX), "count_only": True})
        return version

    def grant(self, ttl: int) -> str:
        return str(self.call("/v3/lease/grant", {"TTL": ttl})["ID"])

    def keepalive(self, lease: str) -> bool:
        answer = self.call("/v3/lease/keepalive", {"ID": lease})
        return int(answer.get("result", {}).get("TTL", 0)) > 0

    def revoke(self, lease: str) -> None:
        self.call("/v3/lease/revoke", {"ID": lease})

    def put(self, key: str, value: str, lease: str | None = None) -> None:
        body = {"key": _b64(key), "value": _b64(value)}
        if lease:
            body["lease"] = lease
        self.call("/v3/kv/put", body)

    def create(self, key: str, value: str) -> bool:
        """Put ``key`` only if it does not exist; True when this call created it."""
        answer = self.call("/v3/kv/txn", {
            "compare": [{"key": _b64(key), "result": "EQUAL", "target": "CREATE", "create_revision": "0"}],
            "success": [{"request_put": {"key": _b64(key), "value": _b64(value)}}]})
        return bool(answer.get("succeeded"))

    def get(self, key: str) -> str | None:
        kvs = self.call("/v3/kv/range", {"key": _b64(key)}).get("kvs", [])
        return _unb64(kvs[0].get("value", "")) if kvs else None

    def prefix(self, prefix: str) -> list[tuple[str, str, int]]:
        """(key, value, create revision) of every key under ``prefix``, in registration order."""
        kvs = self.call("/v3/kv/range", {"key": _b64(prefix), "range_end": _prefix_end(prefix)}).get("kvs", [])
        rows = [(_unb64(kv["key"]), _unb64(kv.get("value", "")), int(kv.get("create_revision", 0))) for kv in kvs]
        return sorted(rows, key=lambda row: row[2])

    def delete_prefix(self, prefix: str) -> None:
        self.call("/v3/kv/deleterange", {"key": _b64(prefix), "range_end": _prefix_end(prefix)})


# --- membership and rounds -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Round:
    """One agreed launch: its number and the member node ids in rank order, with their hosts."""

    number: int
    members: tuple[str, ...]
    hosts: tuple[str, ...]

    def rank_of(self, node: str) -> int | None:
        return self.members.index(node) if node in self.members else None


class Membership:
    """This node's registration under the job, kept alive by a lease, and the agreement on each round."""

    def __init__(self, etcd: Etcd, spec: Elastic, host: str, nproc: int, ttl: int = LEASE_TTL):
        self.etcd, self.spec, self.host = etcd, spec, host
        self.root = f"{PREFIX}{spec.job}/"
        self.node = f"{host}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.ttl = ttl
        if etcd.get(self.root + "done") is not None:
            raise UserError(f"job {spec.job!r} already finished in {etcd.where}; choose another job id "
                            f"(--job_id / --rdzv-id)")
        if not etcd.prefix(self.root + "members/"):
            etcd.delete_prefix(self.root)       # what a crashed earlier run of this job id left behind
        self.lease = etcd.grant(ttl)
        etcd.put(self.root + "members/" + self.node, json.dumps({"host": host, "nproc": nproc}), self.lease)
        self._stop = threading.Event()
        self._keeper = threading.Thread(target=self._keep, daemon=True)
        self._keeper.start()

    def _keep(self) -> None:
        while not self._stop.wait(self.ttl / 3):
            try:
                self.etcd.keepalive(self.lease)
            except UserError:
                continue    # etcd briefly away: the next beat may reach it before the lease ends

    def close(self) -> None:
        self._stop.set()
        try:
            self.etcd.revoke(self.lease)
        except UserError:
            pass

    def members(self) -> dict[str, str]:
        """Live members in registration order: node id -> host."""
        out = {}
        for key, value, _ in self.etcd.prefix(self.root + "members/"):
            try:
                out[key.rsplit("/", 1)[1]] = json.loads(value)["host"]
            except (ValueError, KeyError):
                continue
        return out

    def ready(self, k: int) -> list[str]:
        return [key.rsplit("/", 1)[1] for key, _, _ in self.etcd.prefix(f"{self.root}ready/{k}/")]

    def latest_round(self) -> int:
        """The number of the newest round written, -1 when none."""
        numbers = [int(key.rsplit("/", 1)[1]) for key, _, _ in self.etcd.prefix(self.root + "round/")
                   if key.rsplit("/", 1)[1].isdigit()]
        return max(numbers, default=-1)

    def get_round(self, k: int) -> Round | None:
        value = self.etcd.get(f"{self.root}round/{k}")
        if value is None:
            return None
        data = json.loads(value)
        return Round(k, tuple(data["members"]), tuple(data["hosts"]))

    def finished(self) -> bool:
        return self.etcd.get(self.root + "done") is not None

    def mark_done(self) -> None:
        self.etcd.put(self.root + "done", "1")
        for part in ("round/", "ready/", "finished/", "run_dir"):
            self.etcd.delete_prefix(self.root + part)

    def share_run_dir(self, launch_dir: str) -> None:
        """The run a restart continues (rundir.RUN_DIR_MARKER in the launch directory, written by the first
        start): published once a node has it, and given to a node that joins later, which has never started it."""
        from ppmulti.common.atomic import atomic_write_text
        from ppmulti.common.rundir import RUN_DIR_MARKER

        marker = os.path.join(launch_dir, RUN_DIR_MARKER)
        if os.path.isfile(marker):
            self.etcd.create(self.root + "run_dir", open(marker, encoding="utf-8").read())
            return
        shared = self.etcd.get(self.root + "run_dir")
        if shared:
            atomic_write_text(marker, shared)

    def agree(self, k: int, timeout: float, out: TextIO | None = None) -> Round | None:
        """Round ``k`` or a later one that takes this node in; None when the job finished meanwhile.
        Raises a UserError when fewer than MIN nodes are ready within ``timeout`` seconds."""
        spec = self.spec
        self.etcd.put(f"{self.root}ready/{k}/{self.node}", "", self.lease)
        deadline: float | None = time.monotonic() + timeout
        enough_since: float | None = None
        while True:
            agreed = self.get_round(k)
            if agreed is not None:
                if agreed.rank_of(self.node) is not None:
                    return agreed
                _log(f"round {k} runs without this node ({len(agreed.members)} nodes); waiting for the next", out)
                k += 1
                self.etcd.put(f"{self.root}ready/{k}/{self.node}", "", self.lease)
                deadline, enough_since = None, None   # a round runs: wait for its end, however long
                continue
            if self.finished():
                return None
            live = self.members()
            ready = [n for n in live if n in set(self.ready(k))]
            previous = self.get_round(k - 1) if k > 0 else None
            if previous is not None and any(n in live and n not in ready for n in previous.members):
                # round k-1 still runs on a live node: a node that joined meanwhile waits for its end
                if deadline is not None:
                    deadline = time.monotonic() + timeout
                enough_since = None
                time.sleep(POLL)
                continue
            if len(ready) >= spec.min_nodes and enough_since is None:
                enough_since = time.monotonic()
            if ready and ready[0] == self.node:       # the first ready member writes the round
                everyone = set(live) <= set(ready)
                waited = enough_since is not None and time.monotonic() - enough_since >= spec.last_call
                if len(ready) >= spec.max_nodes or (len(ready) >= spec.min_nodes and ((everyone and k > 0)
                                                                                      or waited)):
                    chosen = ready[:spec.max_nodes]
                    self.etcd.create(f"{self.root}round/{k}", json.dumps(
                        {"members": chosen, "hosts": [live[n] for n in chosen]}))
                    continue
            if deadline is not None and time.monotonic() > deadline:
                raise UserError(f"elastic round {k}: {len(ready)} node(s) ready in {self.etcd.where} after "
                                f"{timeout:g}s, need at least {spec.min_nodes} (--nnodes "
                                f"{spec.min_nodes}:{spec.max_nodes})")
            time.sleep(POLL)

    def lost(self, agreed: Round) -> str | None:
        """Why round ``agreed`` must end now (a member's lease is gone, or a member already waits for the
        next round), or None."""
        live = self.members()
        finished = {key.rsplit("/", 1)[1] for key, _, _ in self.etcd.prefix(f"{self.root}finished/{agreed.number}/")}
        for node, host in zip(agreed.members, agreed.hosts):
            if node not in live and node not in finished:   # a node whose ranks finished may leave first
                return f"node {agreed.rank_of(node)} ({host}) left: its etcd lease expired"
        waiting = set(self.ready(agreed.number + 1)) & set(agreed.members)
        if waiting:
            node = sorted(waiting, key=agreed.members.index)[0]
            return f"node {agreed.rank_of(node)} ({agreed.hosts[agreed.rank_of(node) or 0]}) ended round " \
                   f"{agreed.number}"
        return None


def _log(msg: str, out: TextIO | None = None) -> None:
    print(f"ppmulti launch: {msg}", file=out or sys.stderr, flush=True)


def own_host(plan_host: str | None, etcd_host: str) -> str:
    """This node's address for the others: --host, else the source address of its route to etcd."""
    if plan_host:
        return plan_host
    from ppmulti.procs.launch.netcheck import route_interface

    try:
        addr = socket.gethostbyname(etcd_host)
    except OSError:
        addr = etcd_host
    route = route_interface(addr)
    return route.source if route is not None else "127.0.0.1"


class EtcdRendezvous:
    """The etcd rendezvous behind ``rendezvous.Rendezvous``: rounds agreed by leased membership, each round's nodes
    then meeting as a fixed set (``rendezvous.NodeRendezvous``)."""

    def __init__(self, plan, environ: Mapping[str, str], out: TextIO | None, launch_dir: str):
        from ppmulti.procs.launch.rendezvous import NodeRendezvous

        spec: Elastic = plan.elastic
        etcd = Etcd(spec.etcd_host, spec.etcd_port, spec.endpoint_flag)
        version = etcd.check()
        self.host = own_host(plan.host, spec.etcd_host)
        self.member = Membership(etcd, spec, self.host, plan.nproc_per_node)
        self.nodes = NodeRendezvous(environ)
        self.launch_dir = launch_dir
        self.next_number = self.member.latest_round() + 1
        self.agreed: Round | None = None
        self.rank: int | None = None
        self.last_check = 0.0
        _log(f"elastic: etcd {version} at {spec.endpoint}, job {spec.job!r}, {spec.min_nodes} to {spec.max_nodes} "
             f"node(s); this node is {self.host}", out)

    def next_round(self, plan, out: TextIO | None):
        """The next agreed round this node is in, as its master-mode plan; None when the job finished elsewhere."""
        from ppmulti.procs.launch.plan import DEFAULT_MASTER_PORT
        from ppmulti.procs.launch.rendezvous import Agreed

        agreed = self.member.agree(self.next_number, plan.rdzv_timeout, out)
        if agreed is None:
            _log("the job finished on the other nodes", out)
            return None
        self.agreed, self.next_number, self.last_check = agreed, agreed.number + 1, 0.0
        self.member.share_run_dir(self.launch_dir)
        self.rank = agreed.rank_of(self.member.node)
        assert self.rank is not None
        _log(f"elastic round {agreed.number}: node {self.rank} of {len(agreed.members)} "
             f"({', '.join(agreed.hosts)}), {len(agreed.members) * plan.nproc_per_node} ranks", out)
        one = replace(plan, elastic=None, nnodes=len(agreed.members), node_rank=self.rank,
                      master_addr=agreed.hosts[0], master_port=plan.master_port or DEFAULT_MASTER_PORT,
                      host=self.host, max_restarts=0)
        return Agreed(agreed.number, one)

    def meet(self, plan, listener, out: TextIO | None):
        return self.nodes.meet(plan, listener, out)

    def lost(self) -> str | None:
        """Checked once a second: a member gone or waiting for the next round ends this one."""
        if self.agreed is None or time.monotonic() - self.last_check < 1.0:
            return None
        self.last_check = time.monotonic()
        try:
            return self.member.lost(self.agreed)
        except UserError:
            return None   # etcd briefly unreachable: the training goes on; a lost node still fails it

    def round_ended(self, ok: bool) -> None:
        self.member.share_run_dir(self.launch_dir)
        if ok and self.agreed is not None:
            self.member.etcd.put(f"{self.member.root}finished/{self.agreed.number}/{self.member.node}", "1")
            if self.rank == 0:
                self.member.mark_done()

    def close(self) -> None:
        self.member.close()


def run_elastic(plan, environ: dict[str, str], out: TextIO | None, run_once: Callable[..., int],
                launch: Launch | None = None, launch_dir: str | None = None) -> int:
    """Rounds of master-mode launches agreed through etcd until one ends well, the job is done elsewhere,
    an interrupt, or ``--max_restarts`` rounds after the first have failed. ``run_once(plan, environ, out,
    launch_dir, number, launch, rendezvous)`` runs one round."""
    launch = launch or Launch()
    own_dir = launch_dir is None
    launch_dir = launch_dir or tempfile.mkdtemp(prefix="ppmulti-launch-")
    restarts = DEFAULT_ELASTIC_RESTARTS if plan.max_restarts is None else plan.max_restarts
    try:
        rdzv = EtcdRendezvous(plan, environ, out, launch_dir)
    except BaseException:
        if own_dir:
            shutil.rmtree(launch_dir, ignore_errors=True)
        raise
    try:
        while True:
            launch.to(LaunchState.RENDEZVOUS)
            agreed = rdzv.next_round(plan, out)
            if agreed is None:
                return 0
            rc = run_once(agreed.plan, environ, out, launch_dir, agreed.number, launch, rdzv)
            rdzv.round_ended(rc == 0)
            if rc == 0:
                _log(f"elastic round {agreed.number} finished", out)
                return 0
            if launch.interrupted:
                return rc
            if launch.restarts >= restarts:
                _log(f"giving up after {restarts} restart(s) (--max_restarts)", out)
                return rc
            launch.restart()
            _log(f"elastic round {agreed.number} ended (exit code {rc}); the next round takes the nodes alive now, "
                 f"training resumes from its last checkpoint ({launch.restarts} of {restarts} restarts)", out)
    finally:
        rdzv.close()
        if own_dir:
            shutil.rmtree(launch_dir, ignore_errors=True)
