"""Import albumentations once, without its update check.

albumentations asks PyPI for a newer release when it is first imported: a network request at
every start, and a warning when offline. ``vitkit.data`` imports this module before anything that
uses albumentations, so the check is skipped unless the user set ``NO_ALBUMENTATIONS_UPDATE``
themselves (then their value decides). The environment is left as it was found.
"""

import os

_SWITCH = "NO_ALBUMENTATIONS_UPDATE"

if _SWITCH not in os.environ:
    os.environ[_SWITCH] = "1"
    try:
        import albumentations  # noqa: F401
    finally:
        del os.environ[_SWITCH]
