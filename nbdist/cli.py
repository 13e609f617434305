"""The ``nbdist`` command: ``demo`` and ``serve``."""

from __future__ import annotations

import argparse
import signal
import sys
import threading

from . import __version__
from .config import DEFAULT_PORT


def _serve(args: argparse.Namespace) -> int:
    from .store import Server

    server = Server(args.host, args.port)
    print(f"nbdist {__version__}: rendezvous server on {server.host}:{server.port} (Ctrl-C stops it)", flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        while not stop.wait(0.5):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
    print("nbdist: server stopped", flush=True)
    return 0


def _demo(args: argparse.Namespace) -> int:
    from .demo import run

    if args.world_size < 1:
        print("nbdist demo: --world-size must be at least 1", file=sys.stderr)
        return 2
    return run(args.world_size, args.port)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="nbdist", description="Jupyter notebooks as ranks of one torch world")
    parser.add_argument("--version", action="version", version=f"nbdist {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="run the two-notebook walkthrough in local kernels (CPU, gloo)")
    demo.add_argument("--world-size", type=int, default=2, help="number of notebooks (default 2)")
    demo.add_argument("--port", type=int, default=None, help="rendezvous port (default 29500, or a free one)")
    demo.set_defaults(func=_demo)
    serve = sub.add_parser("serve", help="run a standalone rendezvous server")
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT})")
    serve.set_defaults(func=_serve)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
