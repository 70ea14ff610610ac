"""``python tools/time_to_accuracy.py ARGS`` is ``vitkit time-to-accuracy ARGS`` (the code: vitkit/cli/time_to_accuracy.py)."""
from vitkit.cli.main import exit_with

exit_with("time-to-accuracy")
