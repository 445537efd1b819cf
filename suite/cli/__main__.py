"""`python -m shardbench.suite.cli`: the `shardbench` console script (suite/cli/commands.py)."""
import sys

from shardbench.suite.cli.commands import entry

sys.exit(entry())
