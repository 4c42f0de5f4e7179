"""``python -m scaledl_lab.cli``: the `scaledl-lab` command."""

import sys

from . import main

if __name__ == "__main__":  # not when merely imported (pkgutil.walk_packages does)
    sys.exit(main())
