"""Backends that run one RunSpec: local (this machine) and kubernetes (Helm + MPIJob)."""
from __future__ import annotations


def get_backend(name: str, **options):
    """The backend called `name`, built with `options` (constructor keywords; None values are
    dropped); imported lazily (the kubernetes client is slow to import)."""
    options = {k: v for k, v in options.items() if v is not None}
    if name == "local":
        from tui.suite.backends.local import LocalBackend

        return LocalBackend(**options)
    if name == "kubernetes":
        from tui.suite.backends.kube import KubeBackend

        return KubeBackend(**options)
    raise ValueError(f"unknown backend {name!r}: use local or kubernetes")
