"""``python tools/benchmark.py ARGS`` is ``vitkit benchmark ARGS`` (the code: vitkit/cli/benchmark.py)."""
from vitkit.cli.main import exit_with

exit_with("benchmark")
