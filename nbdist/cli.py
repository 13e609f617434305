"""The ``nbdist`` command: demo, run, bench, follow, export, serve, env, doctor, stop and where."""

from __future__ import annotations

import argparse
import os
import signal
import socket
import sys
import threading

from ._version import __version__
from .config import DEFAULT_PORT


def _serve(args: argparse.Namespace) -> int:
    from .world.store import Server

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())  # before listening: a stop may come at once
    server = Server(args.host, args.port, token=args.token or os.environ.get("NBDIST_TOKEN") or None)
    print(f"nbdist {__version__}: rendezvous server on {server.host}:{server.port} (Ctrl-C stops it)", flush=True)
    try:
        while not stop.wait(0.5):
            pass
    except KeyboardInterrupt:
        print("nbdist: interrupted", flush=True)
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


def _run(args: argparse.Namespace) -> int:
    from .drive.runner import run

    return run(args.notebooks, world_size=args.world_size, out=args.out, timeout=args.timeout,
               params=args.param or [], master_port=args.master_port, spawn=args.spawn,
               max_restarts=args.max_restarts)


def _bench(args: argparse.Namespace) -> int:
    import shlex

    from .errors import ConfigError
    from .measure import bench, benchcli

    flags = {"--ops": args.ops, "--sizes": args.sizes, "--iters": args.iters, "--warmup": args.warmup,
             "--dtype": args.dtype}
    try:
        if args.world_size < 2:
            raise ConfigError(f"--world-size must be at least 2 (this kernel and a worker), not {args.world_size}")
        bench.spec(args.ops, args.sizes, args.iters, args.warmup, args.dtype, args.world_size)
    except ConfigError as exc:
        print(f"nbdist bench: {exc}", file=sys.stderr)
        return 2
    line = shlex.join([part for flag, value in flags.items() if value is not None for part in (flag, value)])
    return benchcli.run(args.world_size, line, args.plot, args.master_port, sys.stdout, sys.stderr)


def _follow(args: argparse.Namespace) -> int:
    from .drive import headless

    def make_session() -> object:
        from IPython.core.interactiveshell import InteractiveShell

        from .magics import registered

        shell = InteractiveShell.instance()  # a plain shell runs the driver's cells, as a kernel would
        assert shell.extension_manager is not None  # an InteractiveShell makes its own
        shell.extension_manager.load_extension("nbdist")
        magics = registered()
        assert magics is not None
        return magics.session

    return headless.run(args, make_session)


def _export(args: argparse.Namespace) -> int:
    import tempfile
    from pathlib import Path

    import nbformat
    from IPython.core.magic_arguments import parse_argstring

    from .errors import ExportError
    from .job import convert, launch
    from .magics import DistMagics

    if args.run is not None and args.run < 1:
        print(f"nbdist export: --run takes a number of ranks, at least 1, not {args.run}", file=sys.stderr)
        return 2
    source = Path(args.notebook)
    try:
        nb = nbformat.read(source, as_version=4)
    except (OSError, ValueError) as exc:
        print(f"nbdist export: cannot read {source}: {exc}", file=sys.stderr)
        return 2
    try:
        script = convert.export(nb, source.name, lambda line: parse_argstring(DistMagics.dist_init, line),
                                lambda line: parse_argstring(DistMagics.collective, line), args.allow_ipython)
    except ExportError as exc:
        print(f"nbdist export: {source}: {exc}", file=sys.stderr)
        return 1
    for note in script.notes:
        print(f"nbdist export: {note}", file=sys.stderr)
    target = Path(args.out) if args.out else None
    if target is None and args.run is None:
        target = source.with_suffix(".py")
    if target is not None:
        target.write_text(script.text, encoding="utf-8")
        print(f"nbdist export: wrote {target}", file=sys.stderr)
    if args.run is None:
        return 0
    extra = args.script_flags
    with tempfile.TemporaryDirectory(prefix="nbdist-export-") as folder:
        path = target or Path(folder) / source.with_suffix(".py").name
        if target is None:
            path.write_text(script.text, encoding="utf-8")
        print(f"nbdist export: {' '.join(launch.command(path, args.run, extra))}", file=sys.stderr, flush=True)
        return launch.run(path, args.run, extra)


def _world_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--master-addr", required=True, help="rank 0's address")
    parser.add_argument("--master-port", type=int, default=DEFAULT_PORT, help=f"default {DEFAULT_PORT}")
    parser.add_argument("--backend", default="auto", help="auto, gloo, nccl or hccl")


def _env(args: argparse.Namespace) -> int:
    from .backend import ascend, backends, envplan
    from .config import validate
    from .errors import ConfigError
    from .world import netinfo

    try:
        cfg = validate(rank=args.rank, world_size=args.world_size, master_addr=args.master_addr,
                       master_port=args.master_port, backend=args.backend,
                       env=envplan.parse_overrides(args.env), debug=args.debug)
        backend = cfg.backend if cfg.backend != "auto" else backends.choose("auto", None, 0).backend
        try:
            route = netinfo.route_to(cfg.master_addr, cfg.master_port)
        except OSError as exc:
            raise ConfigError(f"the master address {cfg.master_addr!r} does not resolve or route: {exc}") from None
        npu = backends.npu_status()[2] if backend == "hccl" else None
        variables = envplan.plan(backend, route, os.environ, cfg.env, cfg.debug, npu)
        pg = envplan.process_group_timeout(backend, variables)
    except ConfigError as exc:
        print(f"nbdist env: {exc}", file=sys.stderr)
        return 2
    print(f"# nbdist {__version__} plan for rank {cfg.rank} of {cfg.world_size}, backend {backend}, "
          f"master {cfg.master_addr}:{cfg.master_port}; process-group timeout {pg:g} s")
    if npu is not None:
        print(f"# Ascend stack here: {ascend.describe(npu)}")
    print("# to use in a shell: set -a; source <(nbdist env ...); set +a")
    print(envplan.as_shell(variables))
    return 0


def _doctor(args: argparse.Namespace) -> int:
    from .backend import doctor

    checks = doctor.run(args.master_addr, args.master_port, args.backend, token=args.token)
    print(doctor.report(checks))
    return 1 if any(c.status == "FAIL" for c in checks) else 0


def _stop(args: argparse.Namespace) -> int:
    from .cell.guard import request_stop
    from .errors import NbdistError
    from .world import keys
    from .world.counters import current_round
    from .world.store import connect

    token = args.token or os.environ.get("NBDIST_TOKEN") or None
    try:
        client = connect(args.master_addr, args.master_port, token=token)
        try:
            round_ = current_round(client)
            if client.get_if(keys.in_round(round_, keys.READY)) is None:
                print(f"nbdist stop: no world has formed at {args.master_addr}:{args.master_port}", file=sys.stderr)
                return 1
            n = request_stop(client, round_, f"nbdist stop in a terminal on {socket.gethostname()}")
        finally:
            client.close()
    except NbdistError as exc:
        print(f"nbdist stop: {exc}", file=sys.stderr)
        return 1
    print(f"nbdist: stop #{n} sent to world round {round_}; every rank ends its running cell within 2 s")
    return 0


def _where(args: argparse.Namespace) -> int:
    from .debug import where
    from .errors import NbdistError
    from .world import keys, signing
    from .world.counters import current_round
    from .world.records import Registration
    from .world.store import connect

    token = args.token or os.environ.get("NBDIST_TOKEN") or None
    if not args.timeout > 0:
        print(f"nbdist where: --timeout must be > 0, not {args.timeout:g}", file=sys.stderr)
        return 2
    try:
        client = connect(args.master_addr, args.master_port, token=token)
        try:
            round_ = current_round(client)
            size = client.get_if(keys.in_round(round_, keys.SIZE))
            if client.get_if(keys.in_round(round_, keys.READY)) is None or size is None:
                print(f"nbdist where: no world has formed at {args.master_addr}:{args.master_port}", file=sys.stderr)
                return 1
            registrations = [keys.in_round(round_, keys.rank(i)) for i in range(int(size))]
            ranks = [Registration.read(t) for t in client.multi_get(registrations)]
            key = signing.key_from(signing.world_secret(token, args.master_addr, args.master_port, client.marker))

            def describe(i: int) -> str:
                info = ranks[i]  # None: its slot holds no registration (anyone can write there)
                return f"rank {i} ({info.host}, pid {info.pid})" if info is not None else f"rank {i} (?, pid ?)"

            print(where.where(client, round_, int(size), key, describe, threads=args.threads, native=args.native,
                              timeout=args.timeout, by=f"nbdist where in a terminal on {socket.gethostname()}"))
        finally:
            client.close()
    except NbdistError as exc:
        print(f"nbdist where: {exc}", file=sys.stderr)
        return 1
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The ``nbdist`` command's parser, each subcommand's ``func`` set (the docs' CLI reference is drawn from it)."""
    parser = argparse.ArgumentParser(prog="nbdist", description="Jupyter notebooks as ranks of one torch world")
    parser.add_argument("--version", action="version", version=f"nbdist {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="run the two-notebook walkthrough in local kernels (CPU, gloo)")
    demo.add_argument("--world-size", type=int, default=2, help="number of notebooks (default 2)")
    demo.add_argument("--port", type=int, default=None, help="rendezvous port (default 29500, or a free one)")
    demo.set_defaults(func=_demo)
    run = sub.add_parser(
        "run", help="execute notebooks headless as the ranks of one world (nbclient, one kernel per rank)",
        description="Execute notebooks headless, all ranks at once, one kernel each: notebook i is rank i, or one "
                    "notebook runs as --world-size copies. Each copy gets a cell tagged injected-parameters "
                    "(after the cell tagged parameters, else first) setting RANK, WORLD_SIZE, MASTER_ADDR "
                    "(127.0.0.1), MASTER_PORT and the --param values; %%dist_init prefers these to the "
                    "notebook's own. A failed cell (one not tagged raises-exception) stops every rank. Writes "
                    "OUT/NAME.rankK.ipynb, also after a failure. Exits 0, 1 if a rank failed, 2 for bad "
                    "arguments, 130 on Ctrl-C.")
    run.add_argument("notebooks", nargs="+", metavar="NOTEBOOK", help="a notebook that joins with %%%%dist_init")
    run.add_argument("--world-size", type=int, default=None, metavar="N",
                     help="ranks (default: the number of notebooks; one notebook runs N copies)")
    run.add_argument("--out", default="nbdist-run", metavar="DIR", help="folder for the executed notebooks "
                     "(default ./nbdist-run)")
    run.add_argument("--timeout", type=int, default=600, metavar="S", help="seconds each cell may run (default 600)")
    run.add_argument("--param", action="append", metavar="KEY=VALUE",
                     help="a parameter for every rank (repeatable): VALUE a Python literal, else a string")
    run.add_argument("--master-port", type=int, default=None, metavar="P", help="rendezvous port (default: a free one)")
    run.add_argument("--spawn", action="store_true",
                     help="run one copy only, as rank 0, with SPAWN = N (N = --world-size, at least 2): its "
                          "%%%%dist_init starts the other ranks as local worker kernels")
    run.add_argument("--max-restarts", default=None, metavar="K",
                     help="with --spawn: start a worker kernel that dies again in its slot, at most K times per rank "
                          "within 10 minutes (MAX_RESTARTS = K; default 3, 0: never)")
    run.set_defaults(func=_run)
    bench = sub.add_parser(
        "bench", help="measure the collectives' bus bandwidth on N local ranks (%%dist_bench in local kernels)",
        description="Start a local kernel that runs %dist_init --spawn N (rank 0 and N-1 worker kernels, on "
                    "127.0.0.1) and %dist_bench with these flags; print its table and write its plot. Exits 0, "
                    "1 if it failed, 2 for bad arguments, 130 on Ctrl-C (after printing the sizes measured so far).")
    bench.add_argument("--world-size", type=int, required=True, metavar="N", help="ranks (at least 2)")
    bench.add_argument("--ops", default=None, help="comma list of all_reduce, all_gather, reduce_scatter, "
                                                   "broadcast, all_to_all, send_recv, or all (default: all)")
    bench.add_argument("--sizes", default=None, help="S in bytes, as nccl-tests: MIN:MAX doubling, one size, or a "
                                                     "comma list; K, M, G are 1024-based (default 8:16M)")
    bench.add_argument("--iters", default=None, help="timed iterations per op and size (default 20)")
    bench.add_argument("--warmup", default=None, help="untimed iterations first (default 5)")
    bench.add_argument("--dtype", default=None, help="torch dtype of the buffers (default float32)")
    bench.add_argument("--plot", default="nbdist-bench.png", metavar="FILE",
                       help="where to write the plot, a PNG (default ./nbdist-bench.png)")
    bench.add_argument("--master-port", type=int, default=None, metavar="P",
                       help="rendezvous port (default 29500, or a free one when it is busy)")
    bench.set_defaults(func=_bench)
    from .drive import headless

    follow = sub.add_parser(
        "follow", help="a headless follower: join a notebook's world and run every cell it drives, until released",
        description="Join the world of a driving notebook as one rank and run every %%collective it runs, until it "
                    "releases the world (%dist_release, %dist_destroy), with no Jupyter kernel: start it with srun, "
                    "sbatch, torchrun, mpirun or ssh. Rank and world size come from the flags, else from the "
                    "launcher plus --rank-offset; the device from the launcher's local rank. Prints one line per "
                    "state change. Exits 0 when released, 1 when following failed (refused token, no master, "
                    "refused cell, driver gone), 2 for bad arguments, 130 on Ctrl-C or SIGTERM.")
    headless.add_arguments(follow)
    follow.set_defaults(func=_follow)
    export = sub.add_parser(
        "export", help="write a rank notebook as a script for torchrun or srun (--run N: and run it on N ranks)",
        usage="nbdist export [-h] [-o SCRIPT] [--run N] [--allow-ipython] NOTEBOOK [-- SCRIPT_FLAGS...]",
        epilog="With --run, the flags after -- go to the script, e.g. nbdist export nb.ipynb --run 2 -- --epochs 3",
        description="Write NOTEBOOK as one Python script that a launcher runs once per rank: %%dist_init becomes "
                    "nbdist.script.init() (the world from torchrun's or Slurm's variables, with the notebook's "
                    "backend, device, --env, --pg-timeout and --debug), %%collective bodies and plain cells "
                    "follow in order, %dist_barrier is dist.barrier(), display magics are dropped, the parameters "
                    "cell's names become --NAME VALUE flags and each cell's last expression is printed. Cells "
                    "tagged nbdist-skip or raises-exception are left out. Exits 0, 1 if a cell has no script "
                    "form (it names the cell and line), 2 for bad arguments; with --run, torchrun's status.")
    export.add_argument("notebook", metavar="NOTEBOOK", help="the notebook (one that runs %%%%dist_init)")
    export.add_argument("-o", "--out", default=None, metavar="SCRIPT",
                        help="where to write the script (default: NOTEBOOK with .py; with --run, a temporary file)")
    export.add_argument("--run", type=int, default=None, metavar="N",
                        help="then run it under torchrun --standalone --nproc-per-node N, each line marked [rank k]")
    export.add_argument("--allow-ipython", action="store_true",
                        help="keep IPython-only lines (!cmd, %%timeit, other magics) as comments instead of refusing")
    export.set_defaults(func=_export)
    serve = sub.add_parser("serve", help="run a standalone rendezvous server")
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT})")
    serve.add_argument("--token", default=None, help="a shared secret ranks must present (else NBDIST_TOKEN)")
    serve.set_defaults(func=_serve)
    env = sub.add_parser("env", help="print the environment plan for a rank (KEY=VALUE lines); starts nothing")
    _world_flags(env)
    env.add_argument("--rank", type=int, default=0)
    env.add_argument("--world-size", type=int, default=2)
    env.add_argument("--env", action="append", metavar="KEY=VALUE", help="an override (repeatable)")
    env.add_argument("--debug", nargs="?", const="files", choices=("files", "stdout"),
                     help="include the backend's debug switches (hccl: CANN keeps its log files, or prints to stdout)")
    env.set_defaults(func=_env)
    doc = sub.add_parser("doctor", help="check address, route, ports, devices; one line per check",
                         description="Check address, route, master port, devices; one line per check. Exits 1 "
                                     "if a check fails, else 0 (a server that requires a token, checked "
                                     "without one, is a warning).")
    _world_flags(doc)
    doc.add_argument("--token", default=None,
                     help="the world's token, to check that the server takes it (else NBDIST_TOKEN); never shown")
    doc.set_defaults(func=_doctor)
    stop = sub.add_parser("stop", help="end the cell every rank of the world is running (as %%dist_stop does)")
    stop.add_argument("--master-addr", required=True, help="rank 0's address")
    stop.add_argument("--master-port", type=int, default=DEFAULT_PORT, help=f"default {DEFAULT_PORT}")
    stop.add_argument("--token", default=None, help="the world's token (else NBDIST_TOKEN); never shown")
    stop.set_defaults(func=_stop)
    where = sub.add_parser(
        "where", help="show where every rank of the world is now: stacks, collectives, native frames (%%dist_where)",
        description="Ask every rank of the world at the address where it is, as %dist_where does, also while its "
                    "cells run: every rank's stack merged into one tree labelled with rank sets, and torch's Flight "
                    "Recorder matched per process group. The request is signed with the world's token (a world on "
                    "this machine without one: its server's key file). Exits 0, 1 if no world answers there.")
    where.add_argument("--master-addr", required=True, help="rank 0's address")
    where.add_argument("--master-port", type=int, default=DEFAULT_PORT, help=f"default {DEFAULT_PORT}")
    where.add_argument("--token", default=None, help="the world's token (else NBDIST_TOKEN); never shown")
    where.add_argument("--threads", action="store_true", help="every thread's stack, not only the cell's")
    where.add_argument("--native", action="store_true",
                       help="native frames too, through py-spy (pip install 'nbdist[debug]')")
    where.add_argument("--timeout", type=float, default=10.0, metavar="S",
                       help="seconds to wait for every rank's answer (default 10)")
    where.set_defaults(func=_where)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    script_flags: list[str] = []
    if argv[:1] == ["export"] and "--" in argv:  # nbdist export NB --run 2 -- --epochs 3: the script's own flags
        cut = argv.index("--")
        argv, script_flags = argv[:cut], argv[cut + 1 :]
    args = parser.parse_args(argv)
    args.script_flags = script_flags
    code: int = args.func(args)  # each subcommand's function returns the exit status
    return code


if __name__ == "__main__":
    sys.exit(main())
