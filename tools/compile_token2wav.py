#!/usr/bin/env python3
"""Compiles a model family's token2wav stages into AOTInductor packages: the entry of the compile
tool, tools/compile/ (its cli.py says what it does; `--help` lists the flags). Called by this path
from scripts/bootstrap.sh, tests/integration/compiled.rs and scripts/device/."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compile.cli import main  # noqa: E402

if __name__ == "__main__":
    main()
