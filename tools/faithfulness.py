"""``python tools/faithfulness.py ARGS`` is ``vitkit faithfulness ARGS`` (the code: vitkit/cli/faithfulness.py)."""
from vitkit.cli.main import exit_with

exit_with("faithfulness")
