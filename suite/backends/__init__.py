"""Backends that run one RunSpec: local (this machine), kubernetes (Helm + MPIJob) and ray (the
ranks as Ray actors in an embedded Ray on this machine, or with the matrix's ray_cluster in a
KubeRay RayJob of the chart).

The one place backends are named and built, and the cluster options are declared: the suite's
CLI and benchtui generate their flags from ClusterOptions.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass, fields

from shardbench.trainer.contract import BACKENDS
from shardbench.trainer.flags import add_flags

PULL_POLICIES = ("Always", "IfNotPresent", "Never")
"""Kubernetes' imagePullPolicy values (--image-pull-policy)."""


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
    image: str | None = None
    """image the pods run, REPOSITORY[:TAG] or REPOSITORY@sha256:... (default: the values file's)."""
    image_repository: str | None = None
    """image repository only (the values file's tag), e.g. registry.example.com/team/shardbench."""
    image_tag: str | None = None
    """image tag only (the values file's repository), e.g. 0.1.0-cu126."""
    image_pull_policy: str | None = None
    """Always, IfNotPresent or Never (default: the chart's IfNotPresent)."""
    resume_checkpoints: bool = False
    """continue from the checkpoints an earlier attempt of the same run left on the results volume
    (default: every attempt starts fresh)."""

    def image_choice(self):
        """The image flags as chart values; ValueError (one line) when they are malformed or conflict."""
        from shardbench.suite.backends.kube.overrides import image_choice

        return image_choice(self.image, self.image_repository, self.image_tag, self.image_pull_policy)


def add_cluster_flags(parser: argparse.ArgumentParser) -> None:
    """--kubeconfig, --context, --namespace, --keep-failed, from ClusterOptions."""
    add_flags(parser.add_argument_group("kubernetes backend"), ClusterOptions)


def cluster_options(args: argparse.Namespace) -> ClusterOptions:
    """The parsed cluster flags; ValueError (one line) when the image flags are malformed or conflict."""
    options = ClusterOptions(**{f.name: getattr(args, f.name) for f in fields(ClusterOptions)})
    options.image_choice()
    return options


def get_backend(name: str, cluster: ClusterOptions | None = None, ray_cluster: bool = False):
    """The backend called `name`; imported lazily (the kubernetes client is slow to import).
    `ray_cluster` is the matrix's setting (MatrixSpec.ray_cluster): backend ray as KubeRay RayJobs
    on the cluster of `cluster`, not an embedded Ray here. It is the matrix's, not a cluster
    option, because it changes how the matrix lays runs out (shape defaults, nodes, faults)."""
    if name == "local":
        from shardbench.suite.backends.local import LocalBackend
        from shardbench.suite.faults.restart import Recovering

        return Recovering(LocalBackend())  # checkpoints, the fault axis, relaunches
    if name == "ray" and ray_cluster:
        from shardbench.suite.backends.kube.rayjob import KubeRayBackend

        c = cluster or ClusterOptions()
        return KubeRayBackend(kubeconfig=c.kubeconfig, context=c.context, namespace=c.namespace,
                              keep_failed=c.keep_failed, start_timeout_s=c.start_timeout_s,
                              image=c.image_choice(), resume_checkpoints=c.resume_checkpoints)
    if name == "ray":
        from shardbench.suite.backends.ray_backend import RayBackend

        return RayBackend()  # an embedded Ray; Ray itself relaunches failed ranks
    if name == "kubernetes":
        from shardbench.suite.backends.kube import KubeBackend

        c = cluster or ClusterOptions()
        return KubeBackend(kubeconfig=c.kubeconfig, context=c.context, namespace=c.namespace,
                           keep_failed=c.keep_failed, start_timeout_s=c.start_timeout_s,
                           image=c.image_choice(), resume_checkpoints=c.resume_checkpoints)
    raise ValueError(f"unknown backend {name!r}: use one of {', '.join(BACKENDS)}")


def availability(name: str, cluster: ClusterOptions | None = None, ray_cluster: bool = False) -> tuple[bool, str]:
    """(True, "") or (False, one-line reason); never raises (a broken backend is unavailable)."""
    try:
        return get_backend(name, cluster, ray_cluster).availability()
    except Exception as exc:  # noqa: BLE001
        return False, f"{type(exc).__name__}: {exc}".splitlines()[0]
