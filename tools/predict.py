"""``python tools/predict.py ...`` is ``vitkit predict ...`` (see vitkit/cli/predict.py)."""
import sys

from vitkit.cli.predict import main

if __name__ == "__main__":
    sys.exit(main())
