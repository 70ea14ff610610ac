"""``python tools/evaluate.py ARGS`` is ``vitkit evaluate ARGS`` (the code: vitkit/cli/evaluate.py)."""
from vitkit.cli.main import exit_with

exit_with("evaluate")
