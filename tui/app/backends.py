"""Backends as the app uses them: built by name, checked for availability, cancellable per run.

The suite's runner has one cancel event for the whole matrix. The Runs screen also cancels a
single run (the current one, or a queued one before it starts), so the app hands the runner a
`PerRunCancel` wrapper that gives each run its own event.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BACKEND_NAMES = ("local", "kubernetes")


@dataclass
class ClusterOptions:
    kubeconfig: str | None = None
    context: str | None = None
    namespace: str | None = None
    keep_failed: bool = False


def make_backend(name: str, cluster: ClusterOptions | None = None):
    """The suite backend called `name` (imports lazily: the cluster one pulls in kubernetes)."""
    if name == "local":
        from tui.suite.backends.local import LocalBackend

        return LocalBackend()
    if name == "kubernetes":
        from tui.suite.backends.kube import KubeBackend

        c = cluster or ClusterOptions()
        return KubeBackend(kubeconfig=c.kubeconfig, context=c.context, namespace=c.namespace,
                           keep_failed=c.keep_failed)
    raise ValueError(f"unknown backend {name!r}: use one of {', '.join(BACKEND_NAMES)}")


def check(name: str, cluster: ClusterOptions | None = None) -> tuple[bool, str]:
    """Availability with a one-line reason; never raises (a broken backend is just unavailable)."""
    try:
        return make_backend(name, cluster).availability()
    except Exception as exc:  # noqa: BLE001
        return False, f"{type(exc).__name__}: {exc}".splitlines()[0]


@dataclass
class PerRunCancel:
    """Wraps a backend so single runs can be cancelled while the matrix goes on."""

    inner: Any
    events: dict[str, threading.Event] = field(default_factory=dict)
    skipped: set[str] = field(default_factory=set)
    matrix_cancel: threading.Event = field(default_factory=threading.Event)

    @property
    def name(self) -> str:
        return self.inner.name

    def availability(self) -> tuple[bool, str]:
        return self.inner.availability()

    def run(self, spec, run_dir: Path, emit, cancel: threading.Event, timeout_s):
        if spec.run_id in self.skipped or self.matrix_cancel.is_set():
            from tui.suite.collect import failed_record

            return failed_record(spec, "cancelled by the user before the run started")
        mine = self.events.setdefault(spec.run_id, threading.Event())
        # The backend polls `mine`; mirror the runner's matrix-wide event into it too.
        stop = threading.Event()
        relay = threading.Thread(target=_relay, args=(cancel, mine, stop), daemon=True)
        relay.start()
        try:
            return self.inner.run(spec, run_dir, emit, mine, timeout_s)
        finally:
            stop.set()

    def cancel_run(self, run_id: str) -> None:
        self.skipped.add(run_id)
        self.events.setdefault(run_id, threading.Event()).set()

    def cancel_all(self) -> None:
        self.matrix_cancel.set()
        for event in self.events.values():
            event.set()


def _relay(source: threading.Event, target: threading.Event, stop: threading.Event) -> None:
    while not stop.is_set():
        if source.wait(0.2):
            target.set()
            return
