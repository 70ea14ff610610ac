"""``python -m vitkit``: the ``vitkit`` command (:func:`vitkit.cli.main.main`), for an environment
where the installed script is not on ``PATH``."""

from __future__ import annotations

import sys

from .cli.main import main

if __name__ == "__main__":
    sys.exit(main())
