"""shardbench: the package tree. Its subpackages are the checkout's top-level folders, committed
as symlinks (shardbench/trainer -> ../trainer, shardbench/suite -> ../suite, shardbench/tui ->
../tui), so `shardbench.*` resolves from a plain checkout: for a type checker and an editor, for
`python -m shardbench...` with that checkout on PYTHONPATH (its own code, not the installed one),
and for the editable install and the wheel (pyproject.toml finds the packages under here)."""
