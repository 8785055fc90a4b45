"""`ppmulti board`: VisualDL on loopback over one run's logs or a directory of runs.

Every training writes its VisualDL log to ``RUN_DIR/vdl`` (rank 0, see ``engine.hooks.VisualDLHook``).
``ppmulti board`` finds those directories (one run, or every run under a directory such as ``output``)
and serves VisualDL over all of them in the foreground, on 127.0.0.1 unless ``--host`` says otherwise.

The server is VisualDL's own Flask app (``visualdl.server.app.create_app``, the one the ``visualdl``
program runs) served by werkzeug on a socket bound here first, so a busy port is one clear line
rather than werkzeug's ``sys.exit(1)``. Telemetry is off: nothing leaves the machine. Ctrl-C (or
SIGTERM) stops it with exit code 0; the process then ends with ``os._exit``, because VisualDL leaves
a thread behind that would otherwise block interpreter shutdown. visualdl is imported only when the
command runs.
"""

from __future__ import annotations

import argparse
import errno
import os
import signal
import socket
import sys
from pathlib import Path
from typing import Any

from ppmulti.common.errors import UserError
from ppmulti.common.flags import add

HELP = "serve VisualDL (loopback) over one run's logs or every run under a directory"
LOG_SUBDIR = "vdl"
DEFAULT_TARGET = "output"
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8040


def register(subparsers: Any) -> None:
    """Add ``board`` to the ``ppmulti`` subcommands."""
    parser = subparsers.add_parser("board", help=HELP, description=HELP)
    parser.add_argument("target", nargs="?", default=DEFAULT_TARGET,
                        help="a run directory, or a directory holding runs (default: output)")
    add(parser, "port", default=DEFAULT_PORT, help=f"port to serve on (default {DEFAULT_PORT})")
    add(parser, "host", default=DEFAULT_HOST, help=f"address to bind (default {DEFAULT_HOST}: this machine only)")
    parser.set_defaults(func=run)


def _has_records(vdl_dir: Path) -> bool:
    """True when ``vdl_dir`` holds at least one VisualDL record file (``vdlrecords.*.log``)."""
    try:
        return any(p.is_file() and p.name.startswith("vdlrecords.") for p in vdl_dir.iterdir())
    except OSError:
        return False


def find_logdirs(target: str | os.PathLike) -> list[Path]:
    """The VisualDL log directories under ``target``, sorted.

    ``target/vdl`` when ``target`` is a run; ``target`` itself when it is a ``vdl`` directory;
    otherwise every ``*/vdl`` below ``target`` at any depth (``output/<run>/vdl`` and nested runs
    such as ``output/<sweep>/<run>/vdl``). A ``vdl`` directory counts only if it holds a record file.
    Raises UserError (one line) when there is none.
    """
    root = Path(target)
    if not root.is_dir():
        what = "is not a directory" if root.exists() else "does not exist"
        raise UserError(f"board target {root} {what}: pass a run directory or a directory of runs "
                        f"(default: {DEFAULT_TARGET})")
    if root.name == LOG_SUBDIR and _has_records(root):
        return [root]
    if _has_records(root / LOG_SUBDIR):
        return [root / LOG_SUBDIR]
    found: list[Path] = []
    for dirpath, dirnames, _ in os.walk(root):
        here = Path(dirpath)
        if LOG_SUBDIR in dirnames and _has_records(here / LOG_SUBDIR):
            found.append(here / LOG_SUBDIR)
        # never descend into a log directory itself, nor into hidden directories
        dirnames[:] = sorted(d for d in dirnames if d != LOG_SUBDIR and not d.startswith("."))
    if not found:
        raise UserError(f"no VisualDL logs under {root}: train a run first, or pass a run directory "
                        f"(one holding {LOG_SUBDIR}/)")
    return sorted(found)


def _url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def _describe(logdirs: list[Path], target: str) -> str:
    if len(logdirs) <= 3:
        return ", ".join(str(d) for d in logdirs)
    return f"{len(logdirs)} runs under {target}"


def _bind(host: str, port: int) -> socket.socket:
    """A listening socket on host:port, bound the way werkzeug would; busy port -> UserError."""
    from werkzeug.serving import get_sockaddr, select_address_family

    if not 0 <= port <= 65535:
        raise UserError(f"--port {port} is not a port number (0-65535)")
    family = select_address_family(host, port)
    try:
        address = get_sockaddr(host, port, family)
    except OSError as exc:  # socket.gaierror: the host does not resolve
        raise UserError(f"--host {host} is not an address of this machine ({exc})") from None
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as werkzeug; a LISTEN port still fails
        sock.bind(address)
        sock.listen(128)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise UserError(f"port {port} is already in use on {host}: stop what holds it, or pick another "
                            f"with --port (e.g. --port {port + 1 if port < 65535 else 8041})") from None
        if exc.errno in (errno.EACCES, errno.EPERM):
            raise UserError(f"no permission to listen on port {port}: use --port above 1023") from None
        raise UserError(f"cannot listen on {host}:{port} ({exc.strerror}): check --host and --port") from None
    return sock


def _make_app(logdirs: list[Path], host: str, port: int):
    """VisualDL's own web app (UI under /app, HTTP API under /app/api) over ``logdirs``."""
    try:
        from visualdl.server.app import create_app
        from visualdl.server.args import ParseArgs
        from visualdl.server.log import init_logger
    except ImportError as exc:
        raise UserError(f"VisualDL is not installed ({exc}): pip install visualdl") from None

    init_logger(0)  # what the visualdl program does: errors only, no per-request or cache chatter
    args = ParseArgs(logdir=[str(d) for d in logdirs], host=host, port=port, telemetry=False,
                     api_only=False, open_browser=False)
    previous = signal.getsignal(signal.SIGINT)
    try:
        app = create_app(args)
    finally:
        signal.signal(signal.SIGINT, previous)  # create_app sets SIG_DFL; keep Ctrl-C a KeyboardInterrupt
    app.wsgi_app = _english_fallback(app.wsgi_app)
    return app


def _english_fallback(wsgi_app):
    """VisualDL's pages answer 500 when the browser asks for neither English nor Chinese (its locale is
    then None and setting the language cookie fails): add English as the lowest-priority choice."""
    def app(environ, start_response):
        asked = environ.get("HTTP_ACCEPT_LANGUAGE", "").strip()
        environ["HTTP_ACCEPT_LANGUAGE"] = f"{asked}, en;q=0.001" if asked else "en"
        return wsgi_app(environ, start_response)
    return app


def _interrupt(signum, frame):  # pragma: no cover - runs in the server process
    raise KeyboardInterrupt


def serve(logdirs: list[Path], host: str = DEFAULT_HOST, port: int = DEFAULT_PORT, target: str = "") -> int:
    """Serve VisualDL over ``logdirs`` on host:port in the foreground until Ctrl-C or SIGTERM; returns 0.

    VisualDL leaves a non-daemon thread behind (see ``run``), so a process that calls this in-process
    should end with ``os._exit``.
    """
    sock = _bind(host, port)
    try:
        from werkzeug.serving import make_server

        app = _make_app(logdirs, host, port)
        server = make_server(host, port, app, threaded=False, fd=sock.fileno())
    finally:
        sock.close()  # the server holds its own duplicate of the listening socket
    print(f"VisualDL: {_url(host, server.port)}  (logs: {_describe(logdirs, target)})", flush=True)
    # Ctrl-C and SIGTERM both stop the server cleanly, even when SIGINT came in ignored (started with &)
    old = {sig: signal.signal(sig, _interrupt) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        server.serve_forever()  # returns on KeyboardInterrupt
    except KeyboardInterrupt:
        pass
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
        server.server_close()
    return 0


def run(args: argparse.Namespace) -> int:
    """``ppmulti board [TARGET] [--host H] [--port P]``."""
    target = str(args.target)
    logdirs = find_logdirs(target)
    try:
        code = serve(logdirs, host=args.host, port=args.port, target=target)
    except KeyboardInterrupt:  # Ctrl-C while starting up
        code = 0
    # VisualDL's profiler reader (built by create_app) starts a non-daemon thread that blocks on a queue
    # forever; its own CLI only ever dies by SIG_DFL. The server socket is closed by now, so end the
    # process here instead of hanging in interpreter shutdown.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
