"""ppmulti's node rendezvous on real loopback sockets: strangers are dropped and logged, nodes of the run that
disagree stop it, the secret never crosses the wire, and the --nodes token reaches a node on stdin only."""

from __future__ import annotations

import io
import json
import re
import socket
import subprocess
import sys
import threading
import time

import pytest

from ppmulti.common import envvars as E
from ppmulti.common.errors import UserError
from ppmulti.procs.launch import rendezvous as R
from ppmulti.procs.launch.flags import build_plan, describe, launch_env, parse_launch_args
from ppmulti.procs.launch.plan import LaunchPlan
from launching import REPO, free_ports

TOKEN = "s3cret-token-of-this-run-0123456789"


def _plans(port: int, nproc1: int = 1, nnodes1: int = 2, job: str = "run1", timeout: float = 20.0):
    node0 = LaunchPlan(script="t.py", nnodes=2, node_rank=0, master_addr="127.0.0.1", master_port=port,
                       job_id=job, rdzv_timeout=timeout)
    node1 = LaunchPlan(script="t.py", nnodes=nnodes1, node_rank=1, master_addr="127.0.0.1", master_port=port,
                       job_id=job, rdzv_timeout=timeout, nproc_per_node=nproc1)
    return node0, node1


def _listener(port: int, host: str = "127.0.0.1") -> socket.socket:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(64)
    return sock


class Side(threading.Thread):
    """One side of the rendezvous on a thread: its log, and the error it ended with (None: it went ahead)."""

    def __init__(self, fn, *args, **kwargs):
        super().__init__(daemon=True)
        self.fn, self.args, self.kwargs = fn, args, kwargs
        self.out = io.StringIO()
        self.error: BaseException | None = None
        self.start()

    def run(self):
        try:
            self.fn(*self.args, out=self.out, **self.kwargs)
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            self.error = exc

    def result(self, timeout: float = 30.0):
        self.join(timeout)
        assert not self.is_alive(), f"{self.fn.__name__} did not finish in {timeout}s: {self.out.getvalue()}"
        return self.error


def _greeted(port: int) -> tuple[socket.socket, dict]:
    conn = socket.create_connection(("127.0.0.1", port), timeout=5)
    line = b""
    while not line.endswith(b"\n"):
        line += conn.recv(4096)
    return conn, json.loads(line)


def _stranger_hello(port: int, token: str, job: str = "run1", protocol: str = R.PROTOCOL) -> socket.socket:
    """A client that speaks the protocol but with its own token / job id / version."""
    conn, challenge = _greeted(port)
    key = R.rdzv_key(job, None, {E.PPMULTI_RDZV_TOKEN: token})
    hello = {"node_rank": 1, "nnodes": 2, "nproc": 1, "job_id": job, "mode": "master", "host": "127.0.0.1"}
    conn.sendall((json.dumps({"protocol": protocol, "hello": hello, "nonce": "n",
                              "mac": R.mac(key, "hello", challenge["nonce"], R._canonical(hello))}) + "\n").encode())
    return conn


def test_strangers_during_a_real_two_node_rendezvous_are_dropped_and_the_run_starts():
    port = free_ports(1, ("127.0.0.1",))
    node0, node1 = _plans(port)
    env = {E.PPMULTI_RDZV_TOKEN: TOKEN}
    server = Side(R.serve_rendezvous, node0, _listener(port), environ=env, hello_timeout=1.0)
    held = []
    # garbage, the issue's {"protocol": "x"}, a partial line, a wrong HMAC, another job, the old protocol, silence
    for payload in (b"GET / HTTP/1.0\r\n\r\n", b'{"protocol": "x"}\n', b'{"protocol": "ppmulti-rd'):
        conn = socket.create_connection(("127.0.0.1", port), timeout=5)
        conn.sendall(payload)
        if payload.endswith(b"rd"):
            conn.shutdown(socket.SHUT_WR)
        held.append(conn)
    held.append(_stranger_hello(port, token="a-guess-at-the-token"))
    held.append(_stranger_hello(port, token=TOKEN, job="another-run"))
    held.append(_stranger_hello(port, token=TOKEN, protocol="ppmulti-rdzv-1"))
    silent = socket.create_connection(("127.0.0.1", port), timeout=5)   # connects, never says a word
    time.sleep(0.3)
    # the real node joins while the silent client still holds its connection open
    client = Side(R.join_rendezvous, node1, environ=env)
    assert client.result() is None, client.out.getvalue()
    assert server.result() is None, server.out.getvalue()
    time.sleep(1.5)   # past the hello timeout: the silent client has been dropped too
    log = server.out.getvalue()
    dropped = [ln for ln in log.splitlines() if "rendezvous: dropped a connection from 127.0.0.1" in ln]
    for why in ("not JSON", "protocol 'x', not 'ppmulti-rdzv-2'", "a partial line", "its HMAC does not match",
                "job id 'another-run', this run's is 'run1'", "protocol 'ppmulti-rdzv-1'"):
        assert sum(why in ln for ln in dropped) == 1, (why, log)
    assert "node 1 joined from" in log and "all 2 nodes joined" in client.out.getvalue()
    assert TOKEN not in log + client.out.getvalue()
    for conn in [*held, silent]:
        conn.close()


def test_a_silent_client_is_dropped_after_the_hello_timeout_and_node_0_keeps_waiting():
    port = free_ports(1, ("127.0.0.1",))
    node0, node1 = _plans(port)
    server = Side(R.serve_rendezvous, node0, _listener(port), environ={}, hello_timeout=0.5)
    silent = socket.create_connection(("127.0.0.1", port), timeout=5)
    time.sleep(1.2)
    assert "no hello within 0.5s; still waiting" in server.out.getvalue()
    assert server.is_alive()
    client = Side(R.join_rendezvous, node1, environ={})
    assert client.result() is None and server.result() is None, server.out.getvalue()
    silent.close()


@pytest.mark.parametrize("case", ["nproc_under_ips", "nnodes"])
def test_a_node_of_this_run_that_disagrees_still_stops_it_with_the_reason(case):
    port = free_ports(2, ("127.0.0.1",)) + 1
    if case == "nproc_under_ips":
        ips = ("127.0.0.2", "127.0.0.3")
        node0 = LaunchPlan(script="t.py", nnodes=2, node_rank=0, ips=ips, host=ips[0], start_port=port + 1,
                           job_id="run1", rdzv_timeout=20)
        node1 = LaunchPlan(script="t.py", nnodes=2, node_rank=1, ips=ips, host=ips[1], start_port=port + 1,
                           job_id="run1", rdzv_timeout=20, nproc_per_node=2)
        needle = "runs 2 processes, node 0 runs 1; under --ips every node must run the same number"
    else:
        node0, _ = _plans(port)
        node1 = LaunchPlan(script="t.py", nnodes=3, node_rank=1, master_addr="127.0.0.1", master_port=port,
                           job_id="run1", rdzv_timeout=20)
        needle = "has --nnodes 3, node 0 has --nnodes 2"
    env = {E.PPMULTI_RDZV_TOKEN: TOKEN}
    server = Side(R.serve_rendezvous, node0, _listener(port, node0.rdzv_endpoint[0]), environ=env)
    client = Side(R.join_rendezvous, node1, environ=env)
    stopped, refused = server.result(), client.result()
    assert isinstance(stopped, R.RendezvousError) and needle in str(stopped), server.out.getvalue()
    assert isinstance(refused, R.RendezvousError) and needle in str(refused), client.out.getvalue()
    assert str(refused).startswith("node 0 stopped the rendezvous: ")


def test_a_node_with_another_token_is_dropped_and_named_missing_at_the_deadline():
    port = free_ports(1, ("127.0.0.1",))
    node0, node1 = _plans(port, timeout=3)
    server = Side(R.serve_rendezvous, node0, _listener(port), environ={E.PPMULTI_RDZV_TOKEN: TOKEN})
    client = Side(R.join_rendezvous, node1, environ={E.PPMULTI_RDZV_TOKEN: "not-the-same-token"})
    refused = client.result()
    assert isinstance(refused, R.RendezvousError) and "another job id or rendezvous token" in str(refused)
    stopped = server.result()
    assert isinstance(stopped, R.RendezvousError) and "missing node_rank 1" in str(stopped)
    assert "its HMAC does not match (another rendezvous token than this node's, from PPMULTI_RDZV_TOKEN)" \
        in server.out.getvalue()


def test_the_secret_never_crosses_the_wire():
    """A relay between node 1 and node 0 records every byte: neither the token nor the key derived from it."""
    port, relay_port = free_ports(1, ("127.0.0.1",)), None
    node0, _ = _plans(port)
    relay = _listener(0)
    relay_port = relay.getsockname()[1]
    _, node1 = _plans(relay_port)
    seen = bytearray()

    def pump(src, dst):
        while True:
            try:
                data = src.recv(4096)
            except OSError:
                data = b""
            if not data:
                try:
                    dst.shutdown(socket.SHUT_WR)
                except OSError:
                    pass
                return
            seen.extend(data)
            dst.sendall(data)

    def serve_relay():
        conn, _ = relay.accept()
        upstream = socket.create_connection(("127.0.0.1", port))
        threading.Thread(target=pump, args=(upstream, conn), daemon=True).start()
        pump(conn, upstream)

    threading.Thread(target=serve_relay, daemon=True).start()
    env = {E.PPMULTI_RDZV_TOKEN: TOKEN}
    server = Side(R.serve_rendezvous, node0, _listener(port), environ=env)
    client = Side(R.join_rendezvous, node1, environ=env)
    assert client.result() is None and server.result() is None, server.out.getvalue() + client.out.getvalue()
    key = R.rdzv_key("run1", None, env).secret
    assert b'"mac"' in seen and TOKEN.encode() not in seen and key not in seen and key.hex().encode() not in seen
    relay.close()


def test_token_file_first_line_and_its_errors(tmp_path):
    good = tmp_path / "rdzv"
    good.write_text(TOKEN + "\nignored\n")
    assert R.rdzv_key("j", str(good), {}).secret == R.rdzv_key("j", None, {E.PPMULTI_RDZV_TOKEN: TOKEN}).secret
    assert R.rdzv_key("j", None, {}).secret != R.rdzv_key("k", None, {}).secret
    assert TOKEN not in repr(R.rdzv_key("j", str(good), {}))
    empty = tmp_path / "empty"
    empty.write_text("\n")
    with pytest.raises(UserError, match=r"^--rdzv-token-file .*empty: its first line is empty"):
        R.rdzv_key("j", str(empty), {})
    with pytest.raises(UserError, match=r"^--rdzv-token-file .*missing: cannot read it \(No such file"):
        R.rdzv_key("j", str(tmp_path / "missing"), {})


def test_dry_run_names_where_the_secret_comes_from_and_the_ranks_never_get_it():
    argv = ["--nnodes", "2", "--node_rank", "1", "--master_addr", "10.0.0.1", "t.py"]
    env = {E.PPMULTI_RDZV_TOKEN: TOKEN}
    plan = build_plan(parse_launch_args(argv), env, set(), 0)
    text = describe(plan, env)
    assert "# rendezvous secret: PPMULTI_RDZV_TOKEN" in text and TOKEN not in text
    child, _, removed = launch_env(plan, env)
    assert E.PPMULTI_RDZV_TOKEN not in child and E.PPMULTI_RDZV_TOKEN in removed
    plan = build_plan(parse_launch_args(["--rdzv-token-file", "/run/secrets/rdzv", *argv]), {}, set(), 0)
    assert "# rendezvous secret: the first line of --rdzv-token-file /run/secrets/rdzv" in describe(plan, {})
    assert "derived from the job id" in describe(build_plan(parse_launch_args(argv), {}, set(), 0), {})


def test_nodes_supervisor_takes_the_token_from_stdin_only():
    """What --nodes runs on a node: the token arrives as the first line of the ssh session's stdin and reaches the
    launch's environment (its dry run names the variable), never its command line or output."""
    argv = [sys.executable, "-m", "ppmulti.procs.launch.nodes", "--run", "T-node1", "--token-stdin", "--",
            "--nnodes", "2", "--node_rank", "1", "--master_addr", "10.0.0.1", "--dry-run", "t.py"]
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)}
    # stdin stays open while the node runs, as the ssh session's does (its EOF would stop the node)
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                            text=True)
    try:
        proc.stdin.write(TOKEN + "\n")
        proc.stdin.flush()
        output = proc.stdout.read()   # until the node's launch ends and closes it
        assert proc.wait(60) == 0, output
    finally:
        proc.stdin.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "# rendezvous secret: PPMULTI_RDZV_TOKEN" in output and TOKEN not in output
    hung_up = subprocess.run(argv, input="", env=env, capture_output=True, text=True, timeout=60)
    assert hung_up.returncode == 1 and "hung up before the run started" in hung_up.stderr


# --- the network check inside the rendezvous (netcheck.py) ----------------------------------------------------
def test_network_check_times_every_node_and_names_the_slowest():
    """Three nodes on loopback, 2 MB each: one line per node with its rate, then the slowest named."""
    port = free_ports(1, ("127.0.0.1",))
    plans = [LaunchPlan(script="t.py", nnodes=3, node_rank=r, master_addr="127.0.0.1", master_port=port,
                        job_id="run1", rdzv_timeout=20, network_check_mb=2.0) for r in range(3)]
    server = Side(R.serve_rendezvous, plans[0], _listener(port), environ={})
    clients = [Side(R.join_rendezvous, plans[r], environ={}) for r in (1, 2)]
    assert [c.result() for c in clients] == [None, None], [c.out.getvalue() for c in clients]
    assert server.result() is None, server.out.getvalue()
    lines = [ln.split("ppmulti launch: network: ")[1] for ln in server.out.getvalue().splitlines() if "network:" in ln]
    # a node is named by its host name and the address node 0 sees, "HOST (127.0.0.1)"
    assert len(lines) == 3 and all(re.match(rf"node {r} at (\S+ \()?127\.0\.0\.1\)? over lo: ", lines[r - 1])
                                   for r in (1, 2)), lines
    assert all("2 MB from node 0 in" in ln for ln in lines[:2]), lines
    slow = lines[2].split()[2]     # "slowest node R at ..."
    rate = lines[int(slow) - 1].split(": ")[1].split(" (")[0]
    assert lines[2].startswith(f"slowest node {slow} at ") and f"127.0.0.1: {rate}, " in lines[2].replace(")", "")
    assert " slower than node " in lines[2]
    assert "network check: 2 MB from node 0 received over lo (127.0.0.1)" in clients[0].out.getvalue()


def test_check_network_must_be_on_every_node():
    port = free_ports(1, ("127.0.0.1",))
    node0, _ = _plans(port)
    node1 = LaunchPlan(script="t.py", nnodes=2, node_rank=1, master_addr="127.0.0.1", master_port=port,
                       job_id="run1", rdzv_timeout=20, check_network=True, network_check_mb=1.0)
    server = Side(R.serve_rendezvous, node0, _listener(port), environ={})
    client = Side(R.join_rendezvous, node1, environ={})
    assert "was started with --check-network, node 0 without" in str(client.result())
    assert "was started with --check-network, node 0 without" in str(server.result())


@pytest.mark.parametrize("argv, needle", [
    (["--check-network", "t.py"], "--check-network checks the links between nodes"),
    (["--check-network", "--no-network-check", "--nnodes", "2", "--node_rank", "1", "--master_addr", "10.0.0.1",
      "t.py"], "--check-network and --no-network-check contradict"),
    (["--network-check-mb", "0", "--nnodes", "2", "--node_rank", "1", "--master_addr", "10.0.0.1", "t.py"],
     "--network-check-mb '0': expected megabytes in 0..4096"),
])
def test_network_check_flags_bad_input_is_one_line(argv, needle):
    with pytest.raises(UserError) as info:
        build_plan(parse_launch_args(argv), {}, set(), 0)
    assert str(info.value).startswith(needle)


def test_network_check_sizes():
    two = ["--nnodes", "2", "--node_rank", "1", "--master_addr", "10.0.0.1", "t.py"]
    size = [build_plan(parse_launch_args(extra + two), {}, set(), 0).network_check_mb
            for extra in ([], ["--check-network"], ["--no-network-check"], ["--network-check-mb", "64"])]
    assert size == [4.0, 32.0, 0.0, 64.0]
    assert build_plan(parse_launch_args(["t.py"]), {}, set(), 0).network_check_mb == 0.0
