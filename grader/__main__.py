import sys

from .frontends.cli import run

sys.exit(run())
