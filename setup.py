"""Maps the checkout's top-level packages into the `shardbench` namespace (pyproject.toml holds
everything else): trainer/ -> shardbench.trainer, suite/ -> shardbench.suite, tui/ ->
shardbench.tui, every subpackage found, so a new folder needs no edit here."""
from setuptools import find_packages, setup

ROOTS = ("trainer", "suite", "tui")

setup(
    package_dir={f"shardbench.{r}": r for r in ROOTS},
    packages=[f"shardbench.{r}{'.' + sub if sub else ''}" for r in ROOTS for sub in ["", *find_packages(r)]],
)
