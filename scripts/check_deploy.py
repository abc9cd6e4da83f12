#!/usr/bin/env python3
"""Runs the check_deploy package (scripts/check_deploy/, see its __init__.py):
`check_deploy.py check|selftest|sync-rules ...` (run by scripts/check-deploy.sh)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from check_deploy.cli import main  # noqa: E402 (after the path)

if __name__ == "__main__":
    sys.exit(main())
