"""`python -m proletarian_ref`: the proletarian-ref command line."""

import sys

from proletarian_ref.cli import main

if __name__ == "__main__":
    sys.exit(main())
