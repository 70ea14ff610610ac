"""``python tools/train.py ARGS`` is ``vitkit train ARGS`` (the code: vitkit/cli/train.py)."""
from vitkit.cli.main import exit_with

exit_with("train")
