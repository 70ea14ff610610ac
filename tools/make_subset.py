"""``python tools/make_subset.py ARGS`` is ``vitkit make-subset ARGS`` (the code: vitkit/cli/make_subset.py)."""
from vitkit.cli.main import exit_with

exit_with("make-subset")
