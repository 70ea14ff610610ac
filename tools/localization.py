"""``python tools/localization.py ARGS`` is ``vitkit localize ARGS`` (the code: vitkit/cli/localization.py)."""
from vitkit.cli.main import exit_with

exit_with("localize")
