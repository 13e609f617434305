#!/usr/bin/env bash
# Every notebook in examples/, executed headless through `nbdist run` (as .ci/run does after the tests):
# all of them on 2 ranks, and the course on 4 as well, each lesson as one notebook per rank and driven
# from one notebook (--spawn). The executed notebooks go to DIR (default: a new temporary folder).
#
#     bash examples/run_examples.sh [DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-$(mktemp -d)}"
run() { echo "+ nbdist run $*"; python -m nbdist run "$@"; }

run examples/two_notebooks/rank0.ipynb examples/two_notebooks/rank1.ipynb --out "$out/two_notebooks"
run examples/one_notebook/walkthrough.ipynb --out "$out/one_notebook"  # its %dist_init --spawn 2 starts rank 1
for lesson in examples/course/*.ipynb; do
    for n in 2 4; do
        run "$lesson" --world-size "$n" --out "$out/course-$n"
        run "$lesson" --world-size "$n" --spawn --out "$out/course-$n-spawn"
    done
done
# PyTorch's tutorials are written for 2 ranks: two peer notebooks, and one that drives
run examples/tutorials/tutorials.ipynb --world-size 2 --out "$out/tutorials"
run examples/tutorials/tutorials.ipynb --world-size 2 --spawn --out "$out/tutorials-spawn"
echo "nbdist: every example notebook ran; executed notebooks in $out"
