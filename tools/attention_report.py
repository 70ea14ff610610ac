"""``python tools/attention_report.py ARGS`` is ``vitkit report ARGS`` (the code: vitkit/cli/attention_report.py)."""
from vitkit.cli.main import exit_with

exit_with("report")
