"""vitkit's command line: one module per ``vitkit`` subcommand (``main(argv) -> int``), the
argument types, error printing and exit statuses they share. Modules import torch and the rest of
vitkit only after their arguments are parsed, so ``--help`` and usage errors answer at once."""
