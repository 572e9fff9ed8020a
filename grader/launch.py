"""`torchrun --nproc-per-node 4 -m grader.launch p3 --target puzzles`: the public name of torchrun's entry point.
The launcher lives in frontends/launch.py; this module keeps the name that people type working."""

import sys

from .frontends.launch import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
