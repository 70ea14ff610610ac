"""``python tools/ablate_heads.py ARGS`` is ``vitkit ablate ARGS`` (the code: vitkit/cli/ablate_heads.py)."""
from vitkit.cli.main import exit_with

exit_with("ablate")
