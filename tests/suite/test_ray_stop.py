"""A Ray-backend run stopped by the suite (timeout or cancel: both SIGTERM the driver through
RayBackend._stop_driver) keeps what its ranks measured: the driver's own SIGTERM handler must
survive `ray.init`, which installs one that exits at once (0 measured steps kept before)."""
from __future__ import annotations

import threading

import pytest

pytest.importorskip("ray")

from shardbench.suite.execute import events as ev  # noqa: E402
from shardbench.suite.backends import get_backend  # noqa: E402
from tests.suite.test_ray_backend import assert_nothing_left, ray_temp_dir, specs  # noqa: E402

pytestmark = pytest.mark.slow


def test_a_stopped_ray_run_keeps_its_measured_steps(tmp_path):
    spec = specs(backend="ray", steps=100000, checkpoint_every=0)[0]
    run_dir = tmp_path / spec.run_id
    run_dir.mkdir()
    cancel, seen = threading.Event(), []

    def emit(event):
        if isinstance(event, ev.RunProgress):
            seen.append(event.step)
            if event.step >= 4:  # warm-up is 1 step: at least 3 measured by now
                cancel.set()

    record = get_backend("ray").run(spec, run_dir, emit, cancel, timeout_s=200)
    assert seen, record["error"]
    assert record["status"] == "failed" and "cancelled" in record["error"]
    assert record["measured_steps"] >= 3, record["error"]
    assert len(record["step_time_s"]["all"]) == record["measured_steps"]
    assert len(record["loss_per_step"]) >= 4
    assert_nothing_left(ray_temp_dir(run_dir), run_dir)
