"""Following a run on the cluster: a watch on its MPIJob, and the launcher pod's resumable log.

The launcher log is read with follow=true and timestamps=true. A follow stream can end while
the launcher still runs: a load balancer or proxy closes a connection that was idle too long
(a long silent init, a big model loading), or the read timeout here fires on a connection that
died without a close. Then the stream is opened again with sinceTime = the second of the last
line seen (the API takes RFC 3339 seconds; the kubelet returns every line from that second on),
and the lines of that second already seen are dropped by their full timestamp and text. The read
loop ends only after a read that began once the launcher had finished, so no tail is lost.
"""
from __future__ import annotations

import functools
import re
import threading
from collections import Counter
from datetime import datetime, timezone
from typing import Callable

from shardbench.suite.backends.kube import api as kapi
from shardbench.suite.backends.kube.diagnosis import launcher_finished

_STAMP = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d{1,9}))?(Z|[+-]\d\d:\d\d) ")


def split_stamp(line: str) -> tuple[tuple[int, int] | None, str]:
    """((epoch second, nanoseconds), text) of a `timestamps=true` log line; (None, line) if none."""
    m = _STAMP.match(line)
    if not m:
        return None, line
    zone = "+00:00" if m.group(3) == "Z" else m.group(3)
    second = int(datetime.fromisoformat(m.group(1) + zone).timestamp())
    nanos = int((m.group(2) or "0").ljust(9, "0"))
    return (second, nanos), line[m.end():]


class LogCursor:
    """Where a timestamped log has been read to: the sinceTime to resume from, and the dedupe."""

    def __init__(self):
        self._second: int | None = None  # epoch second of the last line accepted
        self._window: Counter = Counter()  # (stamp, text) accepted within that second
        self._overlap: Counter = Counter()  # what a resumed stream will send again
        self.accepted = 0  # lines accepted so far

    def since_time(self) -> str | None:
        if self._second is None:
            return None
        return datetime.fromtimestamp(self._second, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")

    def resume(self) -> None:
        """A new connection starts: its first lines may repeat the last second's."""
        self._overlap = Counter(self._window)

    def accept(self, line: str) -> str | None:
        """The line's text if it is new, None if an earlier connection already delivered it."""
        stamp, text = split_stamp(line)
        if stamp is None:
            return text
        key = (stamp, text)
        if self._overlap[key] > 0:
            self._overlap[key] -= 1
            return None
        if self._second is not None and stamp[0] < self._second:
            return None  # a server that ignored sinceTime resent the whole log
        if stamp[0] != self._second:
            self._second, self._window = stamp[0], Counter()
        self._window[key] += 1
        self.accepted += 1
        return text


class JobWatch(threading.Thread):
    """Keeps `job` current from a watch on one MPIJob (re-opened whenever it drops)."""

    def __init__(self, api, namespace: str, name: str, poll_s: float, resource: tuple[str, str, str] = kapi.MPIJOB):
        super().__init__(daemon=True, name=f"watch-{name}")
        self.resource = resource
        """(group, version, plural) of the job watched: the MPIJob, or kube/rayjob.py's RayJob."""
        self.api, self.namespace, self.name, self.poll_s = api, namespace, name, poll_s
        self._job: dict | None = None
        self._resp = None  # the open watch response (closed by stop)
        self._lock = threading.Lock()
        self._halt = threading.Event()

    @property
    def job(self) -> dict | None:
        with self._lock:
            return self._job

    def stop(self) -> None:
        """Stop now: close the open watch too, so no connection outlives the run."""
        self._halt.set()
        kapi.close_stream(self._resp)

    def run(self) -> None:
        from kubernetes import client, watch

        custom = client.CustomObjectsApi(self.api)
        group, version, plural = self.resource

        @functools.wraps(custom.list_namespaced_custom_object)  # Watch reads the return type from its doc
        def listing(*args, **kwargs):
            self._resp = custom.list_namespaced_custom_object(*args, **kwargs)
            return self._resp

        while not self._halt.is_set():
            w = watch.Watch()
            try:
                for event in w.stream(listing, group, version, self.namespace,
                                      plural, field_selector=f"metadata.name={self.name}",
                                      timeout_seconds=max(1, int(self.poll_s * 5)),
                                      _request_timeout=self.poll_s * 5 + 5):
                    obj = event.get("object") or {}
                    if (obj.get("metadata") or {}).get("name") != self.name:
                        continue  # a server that ignores fieldSelector sends every job
                    with self._lock:
                        self._job = None if event.get("type") == "DELETED" else obj
                    if self._halt.is_set():
                        break
            except Exception:  # noqa: BLE001 - read timeouts, dropped streams, 410 Gone: watch again
                # A watch that keeps failing (410 Gone: its history expired; a proxy that cuts
                # streams) delivers no state at all, and a job seen without status reads as "no
                # MPI Operator": read the job itself before watching again.
                self._relist(custom)
                self._halt.wait(self.poll_s)
            finally:
                w.stop()

    def _relist(self, custom) -> None:
        group, version, plural = self.resource  # the job watched: an MPIJob or a RayJob
        try:
            resp = custom.list_namespaced_custom_object(group, version, self.namespace, plural,
                                                        field_selector=f"metadata.name={self.name}",
                                                        _preload_content=False, _request_timeout=self.poll_s * 5 + 5)
            items = [i for i in kapi._json(resp).get("items") or []
                     if (i.get("metadata") or {}).get("name") == self.name]
        except Exception:  # noqa: BLE001 - the API is down too: keep what we knew
            return
        with self._lock:
            self._job = items[0] if items else None


class LauncherLog(threading.Thread):
    """Reads the launcher pod's whole log into `line`, resuming the stream whenever it drops."""

    def __init__(self, api, namespace: str, pod: str, line: Callable[[str], None], retry_s: float,
                 read_timeout_s: float):
        super().__init__(daemon=True, name=f"log-{pod}")
        self.api, self.namespace, self.pod, self.line = api, namespace, pod, line
        self.retry_s, self.read_timeout_s = retry_s, read_timeout_s
        self.cursor = LogCursor()
        self.reconnects = 0
        self._idle, self._seen = 0, 0  # reads in a row that brought no new line; lines at the last
        self._resp = None
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.is_set():
            try:
                pod = kapi.get_pod(self.api, self.namespace, self.pod)
                if pod is None:
                    self.line(f"[shardbench] launcher pod {self.pod} is gone: its log ends here")
                    return
                if launcher_finished(pod):
                    why = self._read()
                    if why is None:
                        return  # a whole read that began after the launcher ended: nothing is missing
                else:
                    why = self._read() or self._closed_early()
            except Exception as exc:  # noqa: BLE001 - the API itself failed: retry like a drop
                why = f"{type(exc).__name__}: {kapi.short(exc)}"
            if why and not self._halt.is_set():
                self.reconnects += 1
                self.line(f"[shardbench] launcher log stream dropped ({why}); resuming from "
                          f"{self.cursor.since_time() or 'the start'}")
                self._halt.wait(self._backoff())

    def _backoff(self) -> float:
        """Seconds before the next read: doubling while reads bring nothing new, up to 30 s."""
        self._idle = 0 if self.cursor.accepted != self._seen else self._idle + 1
        self._seen = self.cursor.accepted
        return min(self.retry_s * 2 ** min(self._idle, 6), max(self.retry_s, 30.0))

    def _closed_early(self) -> str | None:
        """After a clean end: None when the launcher finished (the next read takes the tail)."""
        pod = kapi.get_pod(self.api, self.namespace, self.pod)
        return None if pod is None or launcher_finished(pod) else "closed while the launcher runs"

    def _read(self) -> str | None:
        """One follow stream to its end: None when it ended cleanly, else why it broke."""
        self._resp = kapi.open_log(self.api, self.namespace, self.pod, self.cursor.since_time(),
                                   self.read_timeout_s)
        if self._resp is None:
            return None
        self.cursor.resume()
        pending = b""
        try:
            for chunk in self._resp.stream(4096):
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for raw in lines:
                    self._emit(raw)
        except Exception as exc:  # noqa: BLE001 - a broken line is resent by the next read
            return f"{type(exc).__name__}: {kapi.short(exc)}"
        finally:
            self._resp.release_conn()
        if pending:
            self._emit(pending)
        return None

    def _emit(self, raw: bytes) -> None:
        text = self.cursor.accept(raw.decode("utf-8", errors="replace").rstrip("\r"))
        if text is not None:
            self.line(text)

    def abandon(self) -> None:
        """Stop reading (cancel, timeout): closes the open stream so the thread ends."""
        self._halt.set()
        kapi.close_stream(self._resp)
