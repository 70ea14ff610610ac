"""``python tools/attention_maps.py ARGS`` is ``vitkit maps ARGS`` (the code: vitkit/cli/attention_maps.py)."""
from vitkit.cli.main import exit_with

exit_with("maps")
