"""What nbdist costs a training loop: the seed DDP training in a ``%%collective`` cell against its exported script.

The walkthrough's DDP model (two linear layers, 8.4 M parameters, batch 32, Adam,
gloo on this machine's CPU) trains for ``--steps`` (200) steps:

  (notebook) in a ``%%collective`` cell of one kernel that drives a local worker
             (``%dist_init --spawn 2``): the checks, output capture, live table,
             heartbeat and watcher threads all run, as for any cell;
  (script)   as the script ``nbdist export`` writes from the same notebook, under
             ``torchrun --standalone --nproc-per-node 2``.

Both time the same loop with ``time.perf_counter()`` on each rank (the slowest
rank counts) and use the same ``OMP_NUM_THREADS`` (``--threads``, default 1,
torchrun's own default), so the two differ only by what nbdist adds. Runs are
interleaved (notebook, script, notebook, ...), ``--runs`` (5) each after one
uncounted run of each. It prints every run, the medians, their ratio against the
1.03x target, and where the rest of each run goes: the cell around its loop
(start barrier, capture, the table), and the script's process around its loop
(interpreter, import torch, forming the world).

Run from the repository root::

    .venv/bin/python benchmarks/export_overhead.py [--steps 200] [--runs 5]

Exits 0 when it measured (the target met or not), 1 when a run failed.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nbformat
from _common import begin, figure, load_note, record

from nbdist.demo import SEED_MODEL
from nbdist.drive import kernels
from nbdist.world import netinfo

TRAIN = "%%collective\nimport time\n" + SEED_MODEL.replace("{", "{{").replace("}", "}}") + '''

torch.manual_seed(0)
model = DDP(SimpleModel().to(DEVICE))
torch.manual_seed(1 + RANK)
optimizer = torch.optim.Adam(model.parameters(), lr=0.001)
criterion = nn.MSELoss()
start = time.perf_counter()
for step in range({steps}):
    data = torch.randn(32, 1024, device=DEVICE)
    target = torch.randn(32, 1024, device=DEVICE)
    loss = criterion(model(data), target)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if (step + 1) % 50 == 0:
        print(f"step {{step + 1}}: loss {{loss.item():.4f}}")
print(f"loop_s={{time.perf_counter() - start:.6f}} threads={{torch.get_num_threads()}}")
'''
LOOP = re.compile(r"loop_s=([\d.]+) threads=(\d+)")


def _slowest(text: str, ranks: int = 2) -> tuple[float, int]:
    found = LOOP.findall(text)
    if len(found) != ranks:
        raise RuntimeError(f"expected {ranks} loop timings, found {len(found)}:\n{text[-2000:]}")
    return max(float(s) for s, _ in found), int(found[0][1])


def _script(folder: Path, steps: int) -> Path:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) for src in ("%load_ext nbdist", "%dist_init --spawn 2",
                                                           TRAIN.format(steps=steps))]
    path = folder / "train.ipynb"
    nbformat.write(nb, path)
    done = subprocess.run([sys.executable, "-m", "nbdist", "export", str(path), "-o", str(folder / "train.py")],
                          capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        raise RuntimeError(f"nbdist export failed: {done.stderr}")
    return folder / "train.py"


def _run_script(script: Path, env: dict[str, str]) -> tuple[float, float, int]:
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                           str(script)], capture_output=True, text=True, timeout=900, env=env)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"the script failed ({done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    loop, threads = _slowest(done.stdout)
    return loop, wall, threads


def _run_cell(kernel: kernels.Kernel, cell: str) -> tuple[float, float, int]:
    started = time.perf_counter()
    result = kernel.execute(cell, timeout=900)
    wall = time.perf_counter() - started
    if result.status != "ok":
        raise RuntimeError(f"the cell failed: {result.error}")
    loop, threads = _slowest(result.text())
    return loop, wall, threads


def _line(name: str, values: list[float]) -> str:
    return f"  {name:<34} median {statistics.median(values):8.3f} s   runs " + " ".join(f"{v:.3f}" for v in values)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=200, help="training steps per run (default 200)")
    parser.add_argument("--runs", type=int, default=5, help="counted runs of each (default 5)")
    parser.add_argument("--threads", default="1", help="OMP_NUM_THREADS for both (default 1, torchrun's default)")
    args = parser.parse_args(argv)
    env = {**os.environ, "OMP_NUM_THREADS": args.threads}
    began = begin()
    print(load_note("at the start"))
    with tempfile.TemporaryDirectory(prefix="nbdist-export-bench-") as folder:
        script = _script(Path(folder), args.steps)
        cell = TRAIN.format(steps=args.steps)
        kernel = kernels.Kernel(env={"OMP_NUM_THREADS": args.threads})
        try:
            port = netinfo.first_free_port(range(29600, 29700))
            for code in ("%load_ext nbdist", f"%dist_init --spawn 2 --master-port {port}"):
                result = kernel.execute(code, timeout=180)
                if result.status != "ok":
                    print(f"export_overhead: {code}: {result.error}", file=sys.stderr)
                    return 1
            notebook: list[tuple[float, float, int]] = []
            scripted: list[tuple[float, float, int]] = []
            try:
                for i in range(args.runs + 1):  # the first of each is a warm-up, not counted
                    cell_run, script_run = _run_cell(kernel, cell), _run_script(script, env)
                    if i:
                        notebook.append(cell_run)
                        scripted.append(script_run)
                    print(f"run {i}{' (warm-up)' if not i else ''}: notebook loop {cell_run[0]:.3f} s "
                          f"(cell {cell_run[1]:.3f} s), script loop {script_run[0]:.3f} s "
                          f"(process {script_run[1]:.3f} s)", flush=True)
            except RuntimeError as exc:
                print(f"export_overhead: {exc}", file=sys.stderr)
                return 1
        finally:
            kernel.shutdown()
    nb_loop, sc_loop = [r[0] for r in notebook], [r[0] for r in scripted]
    ratio = statistics.median(nb_loop) / statistics.median(sc_loop)
    paired = statistics.median(n / s for n, s in zip(nb_loop, sc_loop, strict=True))
    print(f"\nseed DDP training, {args.steps} steps, 2 ranks, gloo on CPU, OMP_NUM_THREADS={args.threads} "
          f"(torch saw {notebook[0][2]} thread(s) in the notebook, {scripted[0][2]} in the script), "
          f"{args.runs} runs each, interleaved:")
    print(_line("notebook (%%collective) loop", nb_loop))
    print(_line("script (torchrun) loop", sc_loop))
    print(_line("the cell around its loop", [w - lp for lp, w, _ in notebook]))
    print(_line("the script's process around its loop", [w - lp for lp, w, _ in scripted]))
    print(f"  ratio of medians, notebook / script: {ratio:.3f}x (median of paired ratios {paired:.3f}x)")
    print(load_note("at the end"))
    print(f"target: the notebook's loop at most 1.03x the script's: {ratio:.3f}x, "
          f"{'met' if ratio <= 1.03 else 'NOT met'}")
    record("export_overhead", f"The seed DDP training, {args.steps} steps on 2 ranks (gloo, CPU, OMP_NUM_THREADS="
           f"{args.threads}), in a `%%collective` cell and as its exported script under torchrun, interleaved", [
               figure("notebook (`%%collective`) loop, slowest rank", nb_loop, "s", spread="min–max", decimals=3),
               figure("script (torchrun) loop, slowest rank", sc_loop, "s", spread="min–max", decimals=3),
               figure("ratio of medians, notebook / script", [], "x", median=ratio, runs=args.runs, decimals=3,
                      target="≤ 1.03x", met=ratio <= 1.03),
               figure("the cell around its loop", [w - lp for lp, w, _ in notebook], "s", spread="min–max",
                      decimals=3),
               figure("the script's process around its loop", [w - lp for lp, w, _ in scripted], "s",
                      spread="min–max", decimals=3),
           ], began)
    return 0


if __name__ == "__main__":
    sys.exit(main())
