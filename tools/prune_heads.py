"""``python tools/prune_heads.py ARGS`` is ``vitkit prune ARGS`` (the code: vitkit/cli/prune_heads.py)."""
from vitkit.cli.main import exit_with

exit_with("prune")
