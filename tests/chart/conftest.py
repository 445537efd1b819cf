"""Lets the chart tests import chart_helpers whatever pytest's import mode (importlib mode does not
put test directories on sys.path)."""
import sys
from pathlib import Path

HERE = str(Path(__file__).resolve().parent)
if HERE not in sys.path:
    sys.path.insert(0, HERE)
