"""Backends that run one RunSpec: local (this machine) and kubernetes (Helm + MPIJob).

The one place backends are named and built, and the cluster options are declared: the suite's
CLI and benchtui generate their flags from ClusterOptions.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass, fields

from trainer.contract import BACKENDS
from trainer.flags import add_flags


@dataclass
class ClusterOptions:
    """How the kubernetes backend reaches the cluster."""

    kubeconfig: str | None = None
    """kubeconfig file (default: $KUBECONFIG or ~/.kube/config, else in-cluster credentials)."""
    context: str | None = None
    """kubeconfig context (default: the current one)."""
    namespace: str | None = None
    """namespace of the releases (default: the context's, else default)."""
    keep_failed: bool = False
    """keep a failed run's Helm release for inspection (kubectl describe, logs)."""
    start_timeout_s: float = 900.0
    """seconds from helm install until the launcher pod runs (scheduling, image pulls); the run's
    own timeout starts only then."""


def add_cluster_flags(parser: argparse.ArgumentParser) -> None:
    """--kubeconfig, --context, --namespace, --keep-failed, from ClusterOptions."""
    add_flags(parser.add_argument_group("kubernetes backend"), ClusterOptions)


def cluster_options(args: argparse.Namespace) -> ClusterOptions:
    return ClusterOptions(**{f.name: getattr(args, f.name) for f in fields(ClusterOptions)})


def get_backend(name: str, cluster: ClusterOptions | None = None):
    """The backend called `name`; imported lazily (the kubernetes client is slow to import)."""
    if name == "local":
        from tui.suite.backends.local import LocalBackend
        from tui.suite.faults import Recovering

        return Recovering(LocalBackend())  # checkpoints, the fault axis, relaunches
    if name == "kubernetes":
        from tui.suite.backends.kube import KubeBackend

        c = cluster or ClusterOptions()
        return KubeBackend(kubeconfig=c.kubeconfig, context=c.context, namespace=c.namespace,
                           keep_failed=c.keep_failed, start_timeout_s=c.start_timeout_s)
    raise ValueError(f"unknown backend {name!r}: use one of {', '.join(BACKENDS)}")


def availability(name: str, cluster: ClusterOptions | None = None) -> tuple[bool, str]:
    """(True, "") or (False, one-line reason); never raises (a broken backend is unavailable)."""
    try:
        return get_backend(name, cluster).availability()
    except Exception as exc:  # noqa: BLE001
        return False, f"{type(exc).__name__}: {exc}".splitlines()[0]
