"""Backends that run one RunSpec: local (this machine) and kubernetes (Helm + MPIJob)."""
from __future__ import annotations


def get_backend(name: str):
    """The backend called `name`; imported lazily (the kubernetes client is slow to import)."""
    if name == "local":
        from tui.suite.backends.local import LocalBackend

        return LocalBackend()
    if name == "kubernetes":
        from tui.suite.backends.kube import KubeBackend

        return KubeBackend()
    raise ValueError(f"unknown backend {name!r}: use local or kubernetes")
