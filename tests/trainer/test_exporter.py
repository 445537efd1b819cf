"""The metrics exporter (trainer/exporter.py) never works inside the timed step window: scrapes
that land during a step are answered from the bytes rendered after the previous step."""
from __future__ import annotations

import socket
import threading
import urllib.request

import pytest

from shardbench.trainer.config import parse_args
from shardbench.trainer.dist_env import detect
from tests.trainer.conftest import flag_timed_window
from tests.trainer.test_units import restore_cpu  # noqa: F401 - fixture


@pytest.mark.slow
def test_scrapes_during_steps_cost_no_rendering(restore_cpu):  # noqa: F811
    from shardbench.trainer import exporter
    from shardbench.trainer.train import Trainer

    cfg = parse_args(["--strategy", "ddp", "--seq-len", "64", "--micro-batch", "4", "--steps", "15",
                      "--warmup-steps", "2", "--precision", "fp32", "--device", "cpu", "--metrics-port", "0"])
    t = Trainer(cfg, detect({}))
    t.init_process_group()
    t.build()
    ex = exporter.start(cfg, t.record, 0)
    t.observers.append(ex)
    timing, renders, scrapes = flag_timed_window(t), [], []
    render, scraped = ex._render, ex.scraped
    ex._render = lambda: renders.append(timing[0]) or render()
    ex.scraped = lambda: scrapes.append(timing[0]) or scraped()
    stop = threading.Event()

    def scrape():
        while not stop.is_set():
            with urllib.request.urlopen(f"http://127.0.0.1:{ex.port}/metrics", timeout=10) as resp:
                assert resp.status == 200 and b"shardbench_step" in resp.read()
            stop.wait(0.005)

    scraper = threading.Thread(target=scrape, daemon=True)
    scraper.start()
    try:
        t.train(0.0)
    finally:
        stop.set()
        scraper.join(timeout=10)
        ex.close()
    assert any(scrapes), "no scrape landed inside a timed step: the test proved nothing"
    assert renders and not any(renders), "the exporter rendered inside the timed window"
    # Rendering follows scrapes: at most one per step.
    assert len(renders) <= cfg.steps + 1


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


@pytest.mark.parametrize("rank", [1, 3])
def test_only_rank_0_exports(rank):
    from shardbench.trainer import exporter

    cfg = parse_args(["--strategy", "ddp", "--metrics-port", "0"])
    assert exporter.start(cfg, None, rank) is None


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
