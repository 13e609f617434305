"""Sphinx configuration: MyST pages, myst-nb for the executed example notebooks, the reference drawn from the code.

Build with ``python -m sphinx -W -b html docs docs/_build/html`` (``pip install -e '.[docs]'``); CI does, with
warnings as errors.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE / "_ext"))
sys.path.insert(0, str(ROOT))

from nbdist._version import __version__  # noqa: E402

project = "nbdist"
author = "the nbdist developers"
copyright = "2026, the nbdist developers"
version = release = __version__

extensions = ["myst_nb", "sphinx.ext.autodoc", "nbdist_reference"]
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3
nb_execution_mode = "off"  # the notebooks are executed by examples/execute.py (nbdist run), outputs stored
nb_output_stderr = "show"
exclude_patterns = ["_build", "figures/*.json", "**/.ipynb_checkpoints"]
html_theme = "furo"
html_title = f"nbdist {release}"
autodoc_member_order = "bysource"
autodoc_typehints = "description"

# The example notebooks live in examples/; Sphinx reads documents only under docs/, so copies go to
# docs/_examples (ignored by git), refreshed on every build.
_EXAMPLES = HERE / "_examples"
for notebook in sorted((ROOT / "examples").rglob("*.ipynb")):
    target = _EXAMPLES / notebook.relative_to(ROOT / "examples")
    target.parent.mkdir(parents=True, exist_ok=True)
    if not target.exists() or target.read_bytes() != notebook.read_bytes():
        shutil.copyfile(notebook, target)

smartquotes = False  # `--rank` in prose stays two hyphens, as typed
html_static_path = ["_static"]
html_css_files = ["nbdist.css"]
