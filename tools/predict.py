"""``python tools/predict.py ARGS`` is ``vitkit predict ARGS`` (the code: vitkit/cli/predict.py)."""
from vitkit.cli.main import exit_with

exit_with("predict")
