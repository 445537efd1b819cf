"""Output streams that survive their reader going away (`| head`, a `| tee` killed by Ctrl-C, a
suite that died): progress lines and records are for watchers, and a closed pipe must never stop
what writes the durable copy (result.json) or ends the runs. Torch-free: the suite uses it too."""
from __future__ import annotations

import sys


class TolerantStream:
    """A text stream whose writes are dropped, not raised, once the reader is gone."""

    def __init__(self, inner):
        self._inner, self.broken = inner, False

    def write(self, text: str) -> int:
        if not self.broken:
            try:
                return self._inner.write(text)
            except (OSError, ValueError):  # EPIPE, EBADF, "I/O operation on closed file"
                self.broken = True
        return len(text)

    def flush(self) -> None:
        if not self.broken:
            try:
                self._inner.flush()
            except (OSError, ValueError):
                self.broken = True

    def __getattr__(self, name):
        return getattr(self._inner, name)


def tolerate_closed_readers() -> None:
    """Wrap sys.stdout and sys.stderr (once). SIGPIPE must stay ignored (Python's default) so
    that a write to a closed pipe is an error we can drop instead of a silent death."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is not None and not isinstance(stream, TolerantStream):
            setattr(sys, name, TolerantStream(stream))
