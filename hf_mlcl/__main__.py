"""`python -m hf_mlcl ...` is the same as the `hf-mlcl` console script, exit status included."""

import sys

from hf_mlcl.cli import main

if __name__ == "__main__":
    sys.exit(main())
