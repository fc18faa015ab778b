"""`python -m torchbuild`: the console script, for batch jobs that name the interpreter."""

import sys

from torchbuild.cli import main

if __name__ == "__main__":
    sys.exit(main())
