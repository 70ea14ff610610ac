"""The ``vitkit`` command: ``vitkit <command> [options]``, one subcommand per tool.

Options are parsed (``--help`` and usage errors answered) before the command's module, and with it
torch, Lightning and the rest of vitkit, is imported. This module is the top of the command line:
it imports each command's module by name, and none imports it back (they run through
:func:`vitkit.cli.commands.run_command`).
"""

from __future__ import annotations

import difflib
import importlib
import sys
from collections.abc import Sequence
from typing import NoReturn

from . import parsers
from .commands import MODULES, run_command
from .common import USAGE_ERROR


def usage() -> str:
    width = max(map(len, MODULES))
    lines = [f"  {name:<{width}}  {parsers.summary(module)}" for name, module in MODULES.items()]
    return (
        "usage: vitkit <command> [options]   (vitkit <command> --help for its options)\n\n"
        "commands:\n" + "\n".join(lines) + "\n\n" + parsers.EXIT_STATUS_HELP + "\n"
    )


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
    module = MODULES[args[0]]
    return run_command(args[0], lambda parsed: importlib.import_module(f"{__package__}.{module}").run(parsed), args[1:])


def exit_with(command: str) -> NoReturn:
    """The body of ``tools/<tool>.py``: ``vitkit <command>`` with the script's arguments."""
    sys.exit(main([command, *sys.argv[1:]]))


if __name__ == "__main__":
    sys.exit(main())
