"""``python -m nbdist``: the ``nbdist`` command."""

import sys

from .cli import main

sys.exit(main())
