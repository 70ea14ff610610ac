"""``python tools/explore.py ARGS`` is ``vitkit explore ARGS`` (the code: vitkit/cli/explore.py)."""
from vitkit.cli.main import exit_with

exit_with("explore")
