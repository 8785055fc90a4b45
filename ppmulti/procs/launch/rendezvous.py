"""ppmulti's node rendezvous: node 0 waits for the run's other nodes, which prove they belong with an HMAC.

Node 0 listens on the rendezvous endpoint (master mode: ``--master_addr:--master_port``; ``--ips`` mode:
``ips[0]:start_port - 1``). Every connection is greeted on a thread of its own: node 0 sends a fresh nonce,
and the client has ``HELLO_TIMEOUT`` seconds to answer with one JSON line: its hello (node rank, nnodes,
nproc, job id, mode, host), a nonce of its own, and an HMAC-SHA256 over the hello and node 0's nonce, keyed
with the run's secret. The secret never travels: it is ``PPMULTI_RDZV_TOKEN`` or the first line of
``--rdzv-token-file`` on every node (``--nodes`` makes one per launch and hands it to each node on its ssh
session's stdin); without either, a key derived from the job id, which keeps out other runs and other
versions but not a stranger who knows the job id.

Who is who. A client that is not a node of this run -- silence past ``HELLO_TIMEOUT``, a partial line,
garbage, another protocol version, another job id, a wrong HMAC -- is dropped with one log line and node 0
keeps waiting. A client with a valid HMAC is a node of this run: if it disagrees (nnodes, mode, a rank out
of range or taken, and under ``--ips`` nproc), the rendezvous stops with the reason, on node 0 and on every
node that joined. When all nodes joined within ``--rdzv-timeout``, node 0 answers "go", with an HMAC over the
client's nonce, so that a node knows the answer came from node 0 of its run; each other node closes its
connection first (no TIME_WAIT is left on node 0's port for a quick rerun). At the deadline node 0 names the
node ranks (and under ``--ips`` their addresses) that never joined. Between the last join and the "go", node 0
times each node's link (netcheck.py) unless the plan's ``network_check_mb`` is 0.

One interface. ``Rendezvous`` is what the runner asks of a rendezvous, whichever it is: the world of the next
start (``next_round``), the nodes' meeting before Paddle's launcher starts (``meet``), whether the running start
must end because a node left (``lost``), and the end of a start (``round_ended``). ``NodeRendezvous`` here is the
fixed set of nodes (``--nnodes N``); ``elastic.EtcdRendezvous`` agrees each round through etcd (``--nnodes
MIN:MAX``) and then meets the round's nodes the same way.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import queue
import secrets
import socket
import sys
import threading
import time
from dataclasses import dataclass
from typing import Mapping, Protocol, TextIO

from ppmulti.common import envvars as E
from ppmulti.common.errors import UserError
from ppmulti.procs.launch import netcheck
from ppmulti.procs.launch.plan import LaunchPlan

PROTOCOL = "ppmulti-rdzv-2"
HELLO_TIMEOUT = 5.0      # seconds a client has, from its connection, to answer node 0's nonce
MAX_LINE = 65536         # bytes of one message; longer is garbage
MAX_GREETING = 64        # connections being greeted at once; more are dropped at once (a flood)


class RendezvousError(UserError):
    """A node is missing or disagrees: one line, exit 1 (the flags were fine, the cluster was not)."""

    exit_code = 1


def _log(msg: str, out: TextIO | None = None) -> None:
    print(f"ppmulti launch: {msg}", file=out or sys.stderr, flush=True)


# --- the secret ------------------------------------------------------------------------------------------
@dataclass(frozen=True, repr=False)
class Key:
    """The run's rendezvous key and where it came from (for messages; the key itself is never shown)."""

    secret: bytes
    source: str

    def __repr__(self) -> str:
        return f"Key(<hidden>, source={self.source!r})"


def token_source(token_file: str | None, environ: Mapping[str, str]) -> str:
    """Where the rendezvous secret comes from, in words (--dry-run shows it; the secret is never read here)."""
    if token_file:
        return f"the first line of --rdzv-token-file {token_file}"
    if environ.get(E.PPMULTI_RDZV_TOKEN):
        return E.PPMULTI_RDZV_TOKEN
    return (f"none given ({E.PPMULTI_RDZV_TOKEN} or --rdzv-token-file): derived from the job id, which keeps out "
            f"other runs but not a stranger who knows it")


def rdzv_key(job_id: str | None, token_file: str | None, environ: Mapping[str, str]) -> Key:
    """The key every node of the run derives the same way: --rdzv-token-file, else PPMULTI_RDZV_TOKEN, else
    the job id."""
    if token_file:
        try:
            with open(token_file, "rb") as f:
                token = f.readline().strip()
        except OSError as exc:
            raise UserError(f"--rdzv-token-file {token_file}: cannot read it ({exc.strerror}); every node needs "
                            f"the same file") from None
        if not token:
            raise UserError(f"--rdzv-token-file {token_file}: its first line is empty; write the token there")
        return Key(hashlib.sha256(b"ppmulti-rdzv-token\0" + token).digest(), f"--rdzv-token-file {token_file}")
    token_text = (environ.get(E.PPMULTI_RDZV_TOKEN) or "").strip()
    if token_text:
        return Key(hashlib.sha256(b"ppmulti-rdzv-token\0" + token_text.encode()).digest(), E.PPMULTI_RDZV_TOKEN)
    return Key(hashlib.sha256(b"ppmulti-rdzv-job\0" + (job_id or "").encode()).digest(), "the job id")


def new_token() -> str:
    """A fresh secret for one launch (``--nodes`` hands it to every node)."""
    return secrets.token_hex(32)


def mac(key: Key, *parts: str) -> str:
    return hmac.new(key.secret, "\0".join(parts).encode(), hashlib.sha256).hexdigest()


def _canonical(hello: dict) -> str:
    return json.dumps(hello, sort_keys=True, separators=(",", ":"))


# --- the wire ------------------------------------------------------------------------------------------
def _send(conn: socket.socket, message: dict) -> None:
    try:
        conn.sendall((json.dumps(message) + "\n").encode())
    except OSError:
        pass


class _Garbled(Exception):
    """What came was not one JSON object on one line: the reason, in words."""


def _recv(conn: socket.socket) -> dict | None:
    """One JSON object on one line; None when the other side closed before sending anything. Reads no byte past
    the line end (the network check's bytes follow its header line)."""
    data = b""
    while not data.endswith(b"\n"):
        chunk = conn.recv(4096, socket.MSG_PEEK)
        if not chunk:
            if data:
                raise _Garbled(f"a partial line ({len(data)} bytes) and then it closed")
            return None
        end = chunk.find(b"\n")
        data += conn.recv(end + 1 if end >= 0 else len(chunk))
        if len(data) > MAX_LINE:
            raise _Garbled(f"more than {MAX_LINE} bytes without a line end")
    try:
        message = json.loads(data)
    except ValueError:
        raise _Garbled("not JSON") from None
    if not isinstance(message, dict):
        raise _Garbled("not a JSON object")
    return message


def hello_of(plan: LaunchPlan) -> dict:
    return {"node_rank": plan.node_rank, "nnodes": plan.nnodes, "nproc": plan.nproc_per_node,
            "job_id": plan.job_id or "", "mode": plan.mode, "host": plan.host or socket.gethostname(),
            "check_network": plan.check_network}


# --- node 0 ----------------------------------------------------------------------------------------------
@dataclass
class _Joined:
    conn: socket.socket
    peer: str
    nonce: str


def _node_name(plan: LaunchPlan, rank: int) -> str:
    return f"{rank} ({plan.ips[rank]})" if plan.mode == "ips" else str(rank)


def _stranger(plan: LaunchPlan, key: Key, message: dict | None, nonce: str) -> str | None:
    """Why ``message`` is not the hello of a node of this run (None: it is one)."""
    if message is None:
        return "it closed without a word"
    if message.get("protocol") != PROTOCOL:
        return (f"protocol {str(message.get('protocol'))[:40]!r}, not {PROTOCOL!r} (not ppmulti launch, or "
                f"another version of it)")
    hello, their_nonce, their_mac = message.get("hello"), message.get("nonce"), message.get("mac")
    if not isinstance(hello, dict) or not isinstance(their_nonce, str) or not isinstance(their_mac, str):
        return "an incomplete hello"
    if (hello.get("job_id") or "") != (plan.job_id or ""):
        return f"job id {str(hello.get('job_id'))[:60]!r}, this run's is {plan.job_id or ''!r}"
    if not hmac.compare_digest(their_mac, mac(key, "hello", nonce, _canonical(hello))):
        return f"its HMAC does not match (another rendezvous token than this node's, from {key.source})"
    return None


def _disagreement(plan: LaunchPlan, hello: dict, joined: dict[int, _Joined], peer: str) -> str | None:
    """Why a node of this run cannot join this rendezvous (None: it can)."""
    rank = hello.get("node_rank")
    if hello.get("mode") != plan.mode:
        return f"node {rank} at {peer} was started in {hello.get('mode')} mode, node 0 in {plan.mode} mode"
    if hello.get("nnodes") != plan.nnodes:
        return f"node {rank} at {peer} has --nnodes {hello.get('nnodes')}, node 0 has --nnodes {plan.nnodes}"
    if not isinstance(rank, int) or isinstance(rank, bool) or not 1 <= rank < plan.nnodes:
        return f"{peer} says it is node {rank}; expected a --node_rank in 1..{plan.nnodes - 1}"
    if rank in joined:
        return f"two nodes say --node_rank {rank}: {joined[rank].peer} and {peer}"
    if bool(hello.get("check_network")) != plan.check_network:
        said = ("with --check-network, node 0 without" if hello.get("check_network")
                else "without --check-network, node 0 with it")
        return f"node {rank} at {peer} was started {said}; give the same flags on every node"
    if plan.mode == "ips" and hello.get("nproc") != plan.nproc_per_node:
        return (f"node {rank} at {peer} runs {hello.get('nproc')} processes, node 0 runs {plan.nproc_per_node}; "
                f"under --ips every node must run the same number")
    return None


class _Greeter:
    """Greets each connection on its own thread; the nodes of this run come out of ``verified``."""

    def __init__(self, plan: LaunchPlan, key: Key, out: TextIO | None, timeout: float):
        self.plan, self.key, self.out, self.timeout = plan, key, out, timeout
        self.verified: queue.Queue[tuple[socket.socket, str, dict, str]] = queue.Queue()
        self.busy = threading.Semaphore(MAX_GREETING)
        self.closing = threading.Event()

    def drop(self, conn: socket.socket, peer: str, why: str) -> None:
        conn.close()
        if not self.closing.is_set():
            _log(f"rendezvous: dropped a connection from {peer}: {why}; still waiting", self.out)

    def accept(self, conn: socket.socket, peer: str) -> None:
        if not self.busy.acquire(blocking=False):
            self.drop(conn, peer, f"{MAX_GREETING} connections are being greeted already")
            return
        threading.Thread(target=self._greet, args=(conn, peer), daemon=True).start()

    def _greet(self, conn: socket.socket, peer: str) -> None:
        try:
            nonce = secrets.token_hex(16)
            conn.settimeout(self.timeout)
            try:
                conn.sendall((json.dumps({"protocol": PROTOCOL, "nonce": nonce}) + "\n").encode())
                message = _recv(conn)
            except socket.timeout:
                self.drop(conn, peer, f"no hello within {self.timeout:g}s")
                return
            except _Garbled as exc:
                self.drop(conn, peer, str(exc))
                return
            except OSError as exc:
                self.drop(conn, peer, f"the connection failed ({exc.strerror or exc})")
                return
            why = _stranger(self.plan, self.key, message, nonce)
            if why:
                self.drop(conn, peer, why)
                return
            assert message is not None
            self.verified.put((conn, peer, message["hello"], message["nonce"]))
        finally:
            self.busy.release()


def serve_rendezvous(plan: LaunchPlan, listener: socket.socket, out: TextIO | None = None,
                     environ: Mapping[str, str] | None = None,
                     hello_timeout: float = HELLO_TIMEOUT) -> list[netcheck.Link]:
    """Node 0: wait for nodes 1..N-1, then let them all go; name the missing ones at the deadline. Returns the
    links the network check timed (none without it)."""
    key = rdzv_key(plan.job_id, plan.rdzv_token_file, os.environ if environ is None else environ)
    deadline = time.monotonic() + plan.rdzv_timeout
    joined: dict[int, _Joined] = {}
    addr, port = plan.rdzv_endpoint  # type: ignore[misc]
    _log(f"node 0 waiting up to {plan.rdzv_timeout:g}s for {plan.nnodes - 1} more node(s) on {addr}:{port}", out)
    greeter = _Greeter(plan, key, out, hello_timeout)

    def answer(node: _Joined, message: dict) -> None:
        what = "go" if message.get("go") else "error"
        _send(node.conn, {**message, "mac": mac(key, what, node.nonce, str(message.get("error", "")))})

    def abort(message: str) -> None:
        for node in joined.values():
            answer(node, {"error": message})

    try:
        while len(joined) < plan.nnodes - 1:
            while not greeter.verified.empty():
                conn, peer, hello, nonce = greeter.verified.get()
                peer = peer if hello.get("host") in (None, peer) else f"{hello['host']} ({peer})"
                problem = _disagreement(plan, hello, joined, peer)
                if problem:
                    answer(_Joined(conn, peer, nonce), {"error": problem})
                    conn.close()
                    abort(problem)
                    raise RendezvousError(f"rendezvous stopped: {problem}")
                joined[hello["node_rank"]] = _Joined(conn, peer, nonce)
                _log(f"node {hello['node_rank']} joined from {peer} ({len(joined) + 1}/{plan.nnodes})", out)
            if len(joined) >= plan.nnodes - 1:
                break
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            listener.settimeout(min(remaining, 0.2))
            try:
                conn, (peer, _) = listener.accept()
            except (socket.timeout, InterruptedError):
                continue
            greeter.accept(conn, peer)
        missing = [r for r in range(1, plan.nnodes) if r not in joined]
        if missing:
            names = ", ".join(_node_name(plan, r) for r in missing)
            message = (f"rendezvous timed out after {plan.rdzv_timeout:g}s: {len(joined) + 1} of {plan.nnodes} "
                       f"nodes joined; missing node_rank {names}. Start ppmulti launch there with the same flags "
                       f"(--node_rank for each), or raise --rdzv-timeout")
            abort(message)
            raise RendezvousError(message)
        links = _check_network(plan, joined, out, abort) if plan.network_check_mb > 0 else []
        for node in joined.values():
            answer(node, {"go": True})
        for node in joined.values():
            node.conn.settimeout(5.0)
            try:
                node.conn.recv(1)  # wait for the other side to close first (see the module docstring)
            except OSError:
                pass
    finally:
        greeter.closing.set()
        while not greeter.verified.empty():   # verified after the end: not taken
            greeter.verified.get()[0].close()
        for node in joined.values():
            node.conn.close()
        listener.close()
    return links


def _check_network(plan: LaunchPlan, joined: dict[int, _Joined], out: TextIO | None, abort) -> list[netcheck.Link]:
    """Node 0: time each node's link in turn (netcheck.py), one line each, then name the slowest."""
    nbytes = int(plan.network_check_mb * 1e6)
    links = []
    for rank in sorted(joined):
        node = joined[rank]
        node.conn.settimeout(60.0 + nbytes / 1e5)   # a link slower than 100 kB/s is a failure to report
        start = time.perf_counter()
        try:
            node.conn.sendall((json.dumps({"probe": nbytes}) + "\n").encode())
            netcheck.send_block(node.conn, nbytes)
            reply = _recv(node.conn)
        except (OSError, _Garbled) as exc:
            reply, why = None, str(exc) or type(exc).__name__
        else:
            why = "it closed the connection"
        seconds = time.perf_counter() - start
        if not reply or reply.get("probed") != nbytes:
            message = (f"network check: node {rank} at {node.peer} did not take {nbytes / 1e6:g} MB from node 0 "
                       f"({why}); check the link, or skip the check with --no-network-check")
            abort(message)
            raise RendezvousError(message)
        link = netcheck.Link(rank, node.peer, reply.get("interface"), nbytes, seconds)
        links.append(link)
        _log(link.line(), out)
    line = netcheck.slowest(links)
    if line and len(links) > 1:
        _log(line, out)
    return links


# --- nodes 1..N-1 ------------------------------------------------------------------------------------------
def join_rendezvous(plan: LaunchPlan, out: TextIO | None = None, environ: Mapping[str, str] | None = None) -> None:
    """Nodes 1..N-1: reach node 0 within the timeout, prove this node belongs to the run, wait for its go."""
    key = rdzv_key(plan.job_id, plan.rdzv_token_file, os.environ if environ is None else environ)
    addr, port = plan.rdzv_endpoint  # type: ignore[misc]
    deadline = time.monotonic() + plan.rdzv_timeout
    _log(f"node {plan.node_rank} joining node 0 at {addr}:{port} (up to {plan.rdzv_timeout:g}s)", out)
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise RendezvousError(f"node 0 at {addr}:{port} did not answer within {plan.rdzv_timeout:g}s: start "
                                  f"ppmulti launch with --node_rank 0 there (or check the address and "
                                  f"firewall), or raise --rdzv-timeout")
        try:
            conn = socket.create_connection((addr, port), timeout=min(remaining, 2.0))
            break
        except OSError:
            time.sleep(min(0.3, max(0.0, deadline - time.monotonic())))
    where = f"{addr}:{port}"
    with conn:
        # node 0 answers by its own deadline, which may start later than ours
        conn.settimeout(plan.rdzv_timeout + 30.0)
        try:
            challenge = _recv(conn)
        except (OSError, _Garbled):
            challenge = None
        if challenge is None or challenge.get("protocol") != PROTOCOL or not isinstance(challenge.get("nonce"), str):
            theirs = (challenge or {}).get("protocol")
            raise RendezvousError(f"{where} did not greet as ppmulti's rendezvous {PROTOCOL}"
                                  + (f" (it speaks {str(theirs)[:40]!r}: another ppmulti version)" if theirs else "")
                                  + "; check --master_addr/--master_port and that every node runs the same ppmulti")
        hello, nonce = hello_of(plan), secrets.token_hex(16)
        _send(conn, {"protocol": PROTOCOL, "hello": hello, "nonce": nonce,
                     "mac": mac(key, "hello", challenge["nonce"], _canonical(hello))})
        try:
            reply = _recv(conn)
            while reply is not None and "probe" in reply:   # node 0 times this node's link (netcheck.py)
                nbytes = int(reply["probe"])
                route = netcheck.route_interface(addr)
                netcheck.receive_block(conn, nbytes)
                _send(conn, {"probed": nbytes, "interface": route.interface if route else None})
                _log(f"node {plan.node_rank}: network check: {nbytes / 1e6:g} MB from node 0 received"
                     + (f" over {route.interface} ({route.source})" if route and route.interface else ""), out)
                reply = _recv(conn)
        except (OSError, _Garbled, ValueError, TypeError):
            reply = None
    if reply is None:
        raise RendezvousError(f"node 0 at {where} closed the rendezvous without an answer: it stopped, or it does "
                              f"not take this node (its log names the reason: another job id or rendezvous token)")
    what = "go" if reply.get("go") else "error"
    if not hmac.compare_digest(str(reply.get("mac", "")), mac(key, what, nonce, str(reply.get("error", "")))):
        raise RendezvousError(f"the answer from {where} is not signed with this run's rendezvous token "
                              f"(from {key.source}); is node 0 of this run there?")
    if not reply.get("go"):
        raise RendezvousError(f"node 0 stopped the rendezvous: {reply.get('error', 'no reason given')}")
    _log(f"node {plan.node_rank}: all {plan.nnodes} nodes joined", out)


# --- the one interface the runner talks to -----------------------------------------------------------------
@dataclass(frozen=True)
class Agreed:
    """One start of the ranks: its number (``PPMULTI_RESTART``) and this node's plan for it."""

    number: int
    plan: LaunchPlan


class Rendezvous(Protocol):
    """What the runner asks of a rendezvous (``NodeRendezvous``, ``elastic.EtcdRendezvous``)."""

    def next_round(self, plan: LaunchPlan, out: TextIO | None) -> Agreed | None:
        """The next start's world; None when the job finished elsewhere (nothing left to run)."""

    def meet(self, plan: LaunchPlan, listener: socket.socket | None, out: TextIO | None) -> list[netcheck.Link]:
        """The start's nodes meet before Paddle's launcher starts; the links the network check timed."""

    def lost(self) -> str | None:
        """Why the running start must end now (a node left), or None; polled while the ranks run."""

    def round_ended(self, ok: bool) -> None:
        """This node's ranks ended the start (``ok``: well)."""

    def close(self) -> None:
        """Leave the rendezvous."""


class NodeRendezvous:
    """The fixed set of nodes (``--nnodes N``): the same world every start, met by ``serve_rendezvous`` on node 0
    and ``join_rendezvous`` on the others (nothing to meet on one node)."""

    def __init__(self, environ: Mapping[str, str] | None = None):
        self.environ = environ
        self.number = 0

    def next_round(self, plan: LaunchPlan, out: TextIO | None) -> Agreed:
        agreed = Agreed(self.number, plan)
        self.number += 1
        return agreed

    def meet(self, plan: LaunchPlan, listener: socket.socket | None, out: TextIO | None) -> list[netcheck.Link]:
        if plan.rdzv_endpoint is None:
            return []
        if plan.node_rank == 0:
            return serve_rendezvous(plan, listener, out, self.environ)  # type: ignore[arg-type]
        join_rendezvous(plan, out, self.environ)
        return []

    def lost(self) -> str | None:
        return None   # a fixed world: a node that dies takes the ranks' collectives down, the ranks then fail

    def round_ended(self, ok: bool) -> None:
        return None

    def close(self) -> None:
        return None
