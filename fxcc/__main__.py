"""`python -m fxcc ...` is the `fxcc` command."""

import sys

from fxcc.client.cli import main

if __name__ == "__main__":
    sys.exit(main())
