"""``python -m sweeps``: see :mod:`sweeps.cli`."""

import sys

from sweeps.cli import main

if __name__ == "__main__":
    sys.exit(main())
