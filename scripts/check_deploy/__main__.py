"""`python -m check_deploy <subcommand> ...`, run from scripts/: the same as
scripts/check_deploy.py (the command line is in cli.py)."""

import sys

from .cli import main

sys.exit(main())
