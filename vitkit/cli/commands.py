"""The ``vitkit`` commands and how one runs: parse its options, run it, answer a user's mistake
with one line and release its output folders. Below both the command modules, whose ``main(argv)``
runs themselves through :func:`run_command`, and :mod:`vitkit.cli.main`, the one place that imports
a command's module by name: so no command module imports the entry point back.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from ..allocator import keep_freed_memory
from . import parsers
from .common import cli_errors

#: ``vitkit <command>`` -> the module of ``vitkit.cli`` that runs it (``run(args) -> int``).
MODULES = {
    "train": "train",
    "recipes": "recipes",
    "evaluate": "evaluate",
    "predict": "predict",
    "maps": "attention_maps",
    "faithfulness": "faithfulness",
    "explore": "explore",
    "report": "attention_report",
    "localize": "localization",
    "prune": "prune_heads",
    "ablate": "ablate_heads",
    "init-ablation": "init_ablation",
    "time-to-accuracy": "time_to_accuracy",
    "make-subset": "make_subset",
    "benchmark": "benchmark",
    "export": "export",
}


def run_command(command: str, run: Callable[[argparse.Namespace], int | None], argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` for ``command`` (``--help`` exits here, before ``run`` imports anything heavy),
    then ``run(args)``: a user's mistake becomes one ``error: ...`` line and exit status 2 (see
    :mod:`vitkit.cli.common`)."""
    args = parsers.parse(command, MODULES[command], sys.argv[1:] if argv is None else list(argv))
    keep_freed_memory()  # the process is the command's: freed activations are reused, not unmapped
    status = None
    try:
        status = cli_errors(lambda: run(args), debug=args.debug)
        return status
    finally:  # the command's --out folders: unlocked, and marked complete when it finished
        from vitkit.output_dirs import release_output_dirs

        release_output_dirs(complete=status in (0, 3))
