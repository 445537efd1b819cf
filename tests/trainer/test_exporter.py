"""The metrics exporter (trainer/exporter.py) never works inside the timed step window, and a
scrape reads the trainer's state when it comes: a scrape that lands during a step returns the
last finished step, however long ago the previous scrape was."""
from __future__ import annotations

import re
import socket
import threading
import urllib.request

import pytest

from shardbench.trainer.config import parse_args
from shardbench.trainer.dist_env import detect
from tests.trainer.conftest import flag_timed_window
from tests.trainer.test_units import restore_cpu  # noqa: F401 - fixture


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        assert resp.status == 200
        return resp.read().decode()


def sample(body: str, name: str) -> float | None:
    found = re.search(rf"^{name}{{[^}}]*}} (\S+)$", body, re.M)
    return float(found.group(1)) if found else None


@pytest.mark.slow
def test_scrapes_read_the_state_at_scrape_time_and_steps_do_no_exporter_work(restore_cpu):  # noqa: F811
    from shardbench.trainer import exporter
    from shardbench.trainer.train import Trainer

    cfg = parse_args(["--strategy", "ddp", "--seq-len", "64", "--micro-batch", "4", "--steps", "40",
                      "--warmup-steps", "2", "--precision", "fp32", "--device", "cpu", "--metrics-port", "0"])
    t = Trainer(cfg, detect({}))
    t.init_process_group()
    t.build()
    ex = exporter.start(cfg, t.record, 0)
    t.observers.append(ex)
    timing, updates = flag_timed_window(t), []
    after_step = ex.after_step
    ex.after_step = lambda *a: updates.append(timing[0]) or after_step(*a)
    stop, seen = threading.Event(), []
    done = t.history.losses  # one entry per finished step

    def scraper():
        last = 0
        while not stop.is_set():
            # Scrapes several steps apart, each meant to land inside a step: the old exporter
            # answered with what it rendered after the first step following the previous scrape.
            before = len(done)  # read before the flag: inside a window, `before` steps are done
            if before < last + 3 or not timing[0]:
                stop.wait(0.001)
                continue
            body = scrape(ex.port)
            if timing[0] and len(done) == before:  # wholly inside that one step's timed window
                seen.append((before, sample(body, "shardbench_step")))
            last = len(done)

    thread = threading.Thread(target=scraper, daemon=True)
    thread.start()
    try:
        t.train(0.0)
    finally:
        stop.set()
        thread.join(timeout=10)
        ex.close()
    assert seen, "no scrape landed inside a timed step: the test proved nothing"
    assert all(step == finished for finished, step in seen), seen  # the last finished step, not older
    assert len(updates) == cfg.steps and not any(updates), "the exporter worked inside the timed window"


def test_a_busy_port_is_a_warning_not_a_failed_run():
    from shardbench.trainer import exporter
    from shardbench.trainer.record import ResultRecord

    with socket.socket() as busy:
        busy.bind(("0.0.0.0", 0))
        busy.listen()
        cfg = parse_args(["--strategy", "ddp", "--metrics-port", str(busy.getsockname()[1])])
        record = ResultRecord(run_id="r", strategy="ddp")
        assert exporter.start(cfg, record, 0) is None
    assert record.warnings and record.warnings[0].startswith("metrics: could not serve on port")


def test_every_rank_exports_on_port_plus_local_rank():
    """Rank 3 (local rank 1) serves on the base port + 1, its own series with rank="3", and
    leaves the run's series (settings, throughput, checkpoints) to rank 0."""
    from shardbench.trainer import exporter
    from shardbench.trainer.record import ResultRecord

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        base = probe.getsockname()[1]
    cfg = parse_args(["--strategy", "ddp", "--metrics-port", str(base - 1)])
    ex = exporter.start(cfg, ResultRecord(run_id="r", strategy="ddp"), 3, local_rank=1)
    try:
        assert ex.port == base
        body = scrape(ex.port)
    finally:
        ex.close()
    assert 'shardbench_step{rank="3",run="r",shape="none",strategy="ddp"} 0.0' in body
    assert "shardbench_start_timestamp_seconds{" in body and "shardbench_nccl_env_info{" in body
    assert "shardbench_run_info" not in body and "shardbench_steps{" not in body


@pytest.mark.slow
def test_a_stopped_run_does_not_linger_for_the_hold(tmp_path):
    """--metrics-hold-s keeps a finished run's values up; a run stopped by SIGTERM (the suite
    cancelling it) reports and exits at once instead of holding its endpoint for 300 s."""
    import signal
    import subprocess

    from tests.trainer.conftest import REPO, command, cpu_env

    args = ["--strategy", "ddp", "--seq-len", "32", "--steps", "100000", "--device", "cpu", "--precision", "fp32",
            "--metrics-port", "0", "--metrics-hold-s", "300"]
    proc = subprocess.Popen(command(args, None, 1, tmp_path), cwd=REPO, env=cpu_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        for line in proc.stdout:  # the first progress line: training has started
            if line.startswith("SHARDBENCH_PROGRESS"):
                break
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert "rank 0: metrics on port" in err
    assert proc.returncode == 1 and "terminated by signal SIGTERM" in err
