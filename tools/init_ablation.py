"""``python tools/init_ablation.py ARGS`` is ``vitkit init-ablation ARGS`` (the code: vitkit/cli/init_ablation.py)."""
from vitkit.cli.main import exit_with

exit_with("init-ablation")
