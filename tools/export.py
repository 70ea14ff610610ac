"""``python tools/export.py ARGS`` is ``vitkit export ARGS`` (the code: vitkit/cli/export.py)."""
from vitkit.cli.main import exit_with

exit_with("export")
