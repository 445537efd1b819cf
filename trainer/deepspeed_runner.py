"""DeepSpeed's own launcher (the `deepspeed` command: deepspeed.launcher.runner.main, the same
arguments) without the mlflow its autotuner imports whenever mlflow is installed (the `tracking`
extra). That import cost every DeepSpeed launch here 1.1 CPU-s and 1.5-3 s of wall time before the
first rank started, for autotuning the suite never asks for, and it counted in DeepSpeed's
launcher_startup_s and no other launcher's. The local backend starts `deepspeed ARGS` as
`python -m shardbench.trainer.deepspeed_runner ARGS`; the ranks' own import does the same
(trainer/strategies/zero.py import_deepspeed)."""
from __future__ import annotations

import contextlib
import sys


@contextlib.contextmanager
def mlflow_hidden():
    """`import mlflow` raises ImportError inside (DeepSpeed's autotuner then goes without it),
    unless mlflow is imported already."""
    hidden = "mlflow" not in sys.modules
    if hidden:
        sys.modules["mlflow"] = None  # None: the import machinery's "not importable"
    try:
        yield
    finally:
        if hidden and sys.modules.get("mlflow", 0) is None:
            del sys.modules["mlflow"]


def main() -> int:
    with mlflow_hidden():
        from deepspeed.launcher.runner import main as runner_main
    return runner_main() or 0


if __name__ == "__main__":
    sys.exit(main())
