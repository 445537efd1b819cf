"""Is a directory usable before anything is measured: created, writable, with room for a write
the size of a large record (so a read-only or full mount fails at start, not at the end)."""
from __future__ import annotations

import os
import tempfile

from shardbench.trainer.contract import ConfigError

PROBE_BYTES = 65536


def probe_writable(path: str | os.PathLike, flag: str) -> None:
    """ConfigError (exit 2, one line naming `flag`) when `path` cannot be created or written."""
    try:
        os.makedirs(path, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=path, prefix=".probe-")
        try:
            data = memoryview(b"\0" * PROBE_BYTES)
            while data:  # a nearly full disk takes part of a write and refuses the rest (ENOSPC)
                written = os.write(fd, data)
                if written <= 0:
                    raise OSError(28, "No space left on device")
                data = data[written:]
            os.fsync(fd)
        finally:
            os.close(fd)
            os.unlink(probe)
    except OSError as exc:
        raise ConfigError(f"{flag} {path} is not writable ({exc.strerror or exc}): give a directory "
                          "this user can write, with free space") from None
