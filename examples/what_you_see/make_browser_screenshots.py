"""The README's browser pictures, taken by the browser test itself (tests/test_browser.py).

Runs that test with NBDIST_ARTIFACTS set to a temporary folder, then copies two of its screenshots here:
the two example notebooks side by side in JupyterLab after Run All in each (lab-two-notebooks.png), and
%dist_dashboard while rank 0 waits alone at a %%collective (lab-dashboard.png); with --dark, also the dark
theme's (lab-two-notebooks-dark.png). Needs the lab extra, Playwright's Python package and a system Chromium:

    python examples/what_you_see/make_browser_screenshots.py [--out DIR] [--dark]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
PICTURES = {"two-notebooks.png": "lab-two-notebooks.png", "dashboard.png": "lab-dashboard.png"}
DARK = {"two-notebooks-dark.png": "lab-two-notebooks-dark.png"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=HERE, help="folder to write into (default: next to this script)")
    parser.add_argument("--dark", action="store_true", help="also the dark theme's side-by-side picture")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "NBDIST_ARTIFACTS": tmp}
        env.pop("CI", None)  # a missing browser should say so here, as a skip, not fail
        test = subprocess.run([sys.executable, "-m", "pytest", "-m", "browser", "-p", "no:randomly", "-q",
                               str(ROOT / "tests" / "test_browser.py")], cwd=ROOT, env=env, check=False)
        if test.returncode != 0:
            print("the browser test failed: no pictures copied", file=sys.stderr)
            return test.returncode
        wanted = {**PICTURES, **(DARK if args.dark else {})}
        missing = [name for name in wanted if not (Path(tmp) / name).exists()]
        if missing:
            print(f"the browser test made no {', '.join(missing)} (was it skipped?)", file=sys.stderr)
            return 1
        args.out.mkdir(parents=True, exist_ok=True)
        for name, target in wanted.items():
            shutil.copyfile(Path(tmp) / name, args.out / target)
            print(f"wrote {args.out / target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
