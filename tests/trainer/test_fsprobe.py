"""The writability probe writes its whole probe size for real: a directory with less free space
than that is refused at start (a short os.write was taken as success, and the run failed only
when it wrote its record)."""
from __future__ import annotations

import pytest

from tests.fsfaults import tmpfs
from shardbench.trainer.config import ConfigError
from shardbench.trainer.fsprobe import PROBE_BYTES, probe_writable


def test_a_directory_with_less_room_than_the_probe_is_refused(tmp_path):
    with tmpfs(tmp_path / "small", size="20k") as small:
        assert PROBE_BYTES > 20 * 1024
        with pytest.raises(ConfigError, match="--output-dir .* is not writable"):
            probe_writable(small / "out", "--output-dir")
        assert [p.name for p in (small / "out").iterdir()] == []  # the probe file is gone


def test_a_directory_with_room_passes(tmp_path):
    with tmpfs(tmp_path / "big", size="1m") as big:
        probe_writable(big / "out", "--output-dir")
