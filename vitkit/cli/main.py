"""The ``vitkit`` command: ``vitkit <command> [options]``, one subcommand per tool.

Options are parsed (``--help`` and usage errors answered) before the command's module, and with it
torch, Lightning and the rest of vitkit, is imported.
"""

from __future__ import annotations

import difflib
import importlib
import sys
from collections.abc import Sequence
from typing import NoReturn

from . import parsers
from .common import USAGE_ERROR, cli_errors

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


def usage() -> str:
    width = max(map(len, MODULES))
    lines = [f"  {name:<{width}}  {parsers.summary(module)}" for name, module in MODULES.items()]
    return (
        "usage: vitkit <command> [options]   (vitkit <command> --help for its options)\n\n"
        "commands:\n" + "\n".join(lines) + "\n\n" + parsers.EXIT_STATUS_HELP + "\n"
    )


def run_command(command: str, argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` for ``command`` (``--help`` exits here, before any heavy import), then run it:
    a user's mistake becomes one ``error: ...`` line and exit status 2 (see :mod:`vitkit.cli.common`)."""
    module = MODULES[command]
    args = parsers.parse(command, module, sys.argv[1:] if argv is None else list(argv))
    status = None
    try:
        status = cli_errors(lambda: importlib.import_module(f"{__package__}.{module}").run(args), debug=args.debug)
        return status
    finally:  # the command's --out folders: unlocked, and marked complete when it finished
        from vitkit.output_dirs import release_output_dirs

        release_output_dirs(complete=status in (0, 3))


def main(argv: Sequence[str] | None = None) -> int:
    """The ``vitkit`` entry point."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(usage(), end="", file=sys.stdout if args else sys.stderr)
        return 0 if args else USAGE_ERROR
    if args[0] == "--version":
        from vitkit import __version__

        print(f"vitkit {__version__}")
        return 0
    if args[0] not in MODULES:
        close = difflib.get_close_matches(args[0], MODULES, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        print(f"error: unknown command {args[0]!r}.{hint} Commands: {', '.join(MODULES)}.", file=sys.stderr)
        return USAGE_ERROR
    return run_command(args[0], args[1:])


def exit_with(command: str) -> NoReturn:
    """The body of ``tools/<tool>.py``: ``vitkit <command>`` with the script's arguments."""
    sys.exit(main([command, *sys.argv[1:]]))


if __name__ == "__main__":
    sys.exit(main())
