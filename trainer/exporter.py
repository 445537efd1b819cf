"""Live metrics of rank 0 for Prometheus (`--metrics-port`), in prometheus-client's registry.

Nothing here runs inside the timed step window. The trainer calls `after_step()` after the step
timer has stopped; that is where values are set and, only when a scrape came since the last
rendering, the exposition text is rendered (prometheus-client's generate_latest). The HTTP
thread only hands out those cached bytes: a scrape that lands during a step costs a socket write,
never a walk over the registry or a read of the device. `tests/trainer/test_exporter.py` checks
that no rendering happens while a step is timed.

Names follow Prometheus conventions: the `shardbench_` prefix, base units in the name
(`_seconds`, `_bytes`, `_ratio`, `_celsius`), `_total` for counters; every series carries the
labels `run`, `strategy` and `shape` (the shape's values file name, or "none").
"""
from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

# Step times run from about a millisecond (tiny model on CPU) to tens of seconds (7B on GPUs).
STEP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 25.0, 60.0)
LABELS = ("run", "strategy", "shape")


class Metrics:
    """The series, in a registry of their own (nothing of the process's default registry)."""

    def __init__(self) -> None:
        # Imported here: a trainer without prometheus-client runs, it only cannot export (start()).
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        r = self.registry = CollectorRegistry(auto_describe=True)

        def g(name, doc, extra=()):
            return Gauge(name, doc, LABELS + tuple(extra), registry=r)

        self.info = g("shardbench_run_info", "1 for the run; its settings as labels",
                      ("world_size", "launcher", "model", "precision", "device"))
        self.step = g("shardbench_step", "Optimizer steps done (warm-up included)")
        self.steps = g("shardbench_steps", "Optimizer steps the run will do")
        self.loss = g("shardbench_loss", "Loss of the last step (rank 0's)")
        self.tokens = g("shardbench_tokens_per_second",
                        "Global tokens/s of the last measured step (tokens per step / its time)")
        self.expected = g("shardbench_expected_tokens_per_second",
                          "The throughput this run is expected to reach (--expected-tokens-per-s)")
        self.step_last = g("shardbench_step_last_seconds", "Time of the last measured step")
        self.step_hist = Histogram("shardbench_step_duration_seconds", "Time of each measured step",
                                   LABELS, buckets=STEP_BUCKETS, registry=r)
        self.last_step_ts = g("shardbench_last_step_timestamp_seconds", "Unix time the last step ended")
        self.memory = g("shardbench_memory_bytes", "Rank 0's memory by category", ("category",))
        self.comm_bytes = Counter("shardbench_comm_bytes", "Bytes of the collectives of measured steps",
                                  LABELS + ("op",), registry=r)
        self.comm_calls = Counter("shardbench_comm_calls", "Collective calls of measured steps",
                                  LABELS + ("op",), registry=r)
        self.comm_seconds = Counter("shardbench_comm_seconds", "Time at least one collective of the op was "
                                    "in flight in measured steps (trainer/comm.py)", LABELS + ("op",), registry=r)
        self.ckpt_save = g("shardbench_checkpoint_save_seconds", "Time of the last finished checkpoint save")
        self.ckpt_saves = g("shardbench_checkpoint_saves", "Checkpoints saved in this run")
        self.ckpt_load = g("shardbench_checkpoint_load_seconds", "Time the resume's checkpoint load took")
        self.restarts = g("shardbench_restarts", "Times this run was restarted from a checkpoint")
        self.gpu_util = g("shardbench_gpu_utilization_ratio", "GPU utilisation of rank 0's device (NVML)")
        self.gpu_temp = g("shardbench_gpu_temperature_celsius", "GPU temperature of rank 0's device (NVML)")
        self.nccl_disagree = g("shardbench_nccl_env_disagreement",
                               "NCCL_* variables whose values differ between ranks (known at the end)")
        self.finished = g("shardbench_finished", "1 once the run has ended (ok or not)")
        self.ok = g("shardbench_run_ok", "1 when the run ended with status ok (set at the end)")


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 - http.server's name
        if self.path.split("?")[0] not in ("/metrics", "/"):
            self.send_error(404)
            return
        body = self.server.exporter.scraped()
        self.send_response(200)
        self.send_header("Content-Type", self.server.exporter.content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):  # quiet: rank 0's stderr is the run's log
        pass


class Exporter:
    """Rank 0's metrics endpoint. `after_step()` and `finish()` are called by the trainer
    outside the timed window; the server thread serves the last rendering."""

    def __init__(self, cfg, record, port: int, host: str = "0.0.0.0"):
        from prometheus_client.exposition import CONTENT_TYPE_LATEST

        self.m = Metrics()
        self.content_type = CONTENT_TYPE_LATEST
        self.labels = {"run": record.run_id, "strategy": record.strategy, "shape": record.gpu_shape or "none"}
        self.m.info.labels(**self.labels, world_size=str(record.world_size), launcher=str(record.launcher),
                           model=str(record.model.get("preset")), precision=record.precision,
                           device=record.device).set(1)
        self.m.steps.labels(**self.labels).set(cfg.steps)
        if cfg.expected_tokens_per_s:
            self.m.expected.labels(**self.labels).set(cfg.expected_tokens_per_s)
        self.tokens_per_step = record.tokens_per_step
        self._comm_seen: dict[str, tuple[int, int, float]] = {}
        self._lock = threading.Lock()
        self._body = b""
        self._wanted = True  # a scrape came since the last rendering
        self.renders = 0
        self._render()
        self.server = ThreadingHTTPServer((host, port), _Handler)
        self.server.daemon_threads = True
        self.server.exporter = self
        self.port = self.server.server_address[1]
        self._thread = threading.Thread(target=self.server.serve_forever, name="metrics", daemon=True)
        self._thread.start()

    # -- the server thread ----------------------------------------------------------------------
    def scraped(self) -> bytes:
        with self._lock:
            self._wanted = True
            return self._body

    # -- the trainer's thread, outside the timed window -------------------------------------------
    def _render(self) -> None:
        from prometheus_client.exposition import generate_latest

        body = generate_latest(self.m.registry)
        self.renders += 1
        with self._lock:
            self._body, self._wanted = body, False

    def after_step(self, trainer, step: int, dt: float, loss: float, measured: bool) -> None:
        m, lab = self.m, self.labels
        m.step.labels(**lab).set(step + 1)
        m.loss.labels(**lab).set(loss)
        m.last_step_ts.labels(**lab).set(time.time())
        if measured:
            m.tokens.labels(**lab).set(self.tokens_per_step / dt)
            m.step_last.labels(**lab).set(dt)
            m.step_hist.labels(**lab).observe(dt)
            self._comm(trainer)
        self._memory(trainer)
        self._checkpoints(trainer)
        if self._wanted:
            self._gpu(trainer)
            self._render()

    def _comm(self, trainer) -> None:
        """The counter's running totals (trainer/comm.py), added as the increase since last time."""
        from shardbench.trainer.comm import COUNTER

        for op in list(COUNTER.calls):
            now = (COUNTER.calls.get(op, 0), COUNTER.bytes.get(op, 0), COUNTER.seconds.get(op, 0.0))
            seen = self._comm_seen.get(op, (0, 0, 0.0))
            if now[0] > seen[0]:
                self.m.comm_calls.labels(**self.labels, op=op).inc(now[0] - seen[0])
                self.m.comm_bytes.labels(**self.labels, op=op).inc(max(0, now[1] - seen[1]))
                self.m.comm_seconds.labels(**self.labels, op=op).inc(max(0.0, now[2] - seen[2]))
                self._comm_seen[op] = now

    def _memory(self, trainer) -> None:
        """Cheap reads only (allocator counters on GPU, /proc's resident size on CPU): no sync."""
        mem = self.m.memory
        if trainer.device.type == "cuda":
            import torch

            mem.labels(**self.labels, category="allocated").set(torch.cuda.memory_allocated(trainer.device))
            mem.labels(**self.labels, category="reserved").set(torch.cuda.memory_reserved(trainer.device))
            mem.labels(**self.labels, category="peak_allocated").set(torch.cuda.max_memory_allocated(trainer.device))
        rss = _rss_bytes()
        if rss is not None:
            mem.labels(**self.labels, category="rss").set(rss)

    def _checkpoints(self, trainer) -> None:
        self.m.restarts.labels(**self.labels).set(trainer.history.restarts)
        if trainer.ckpt is None:
            return
        ck = trainer.ckpt.ckpt  # trainer.history.CheckpointHooks around the Checkpointer
        s = ck.stats
        self.m.ckpt_saves.labels(**self.labels).set(s.saves)
        if s.save_s:
            self.m.ckpt_save.labels(**self.labels).set(s.save_s[-1])
        if s.load_s is not None:
            self.m.ckpt_load.labels(**self.labels).set(s.load_s)

    def _gpu(self, trainer) -> None:
        """NVML utilisation and temperature through torch (needs nvidia-ml-py); absent: no series."""
        if trainer.device.type != "cuda":
            return
        import torch

        try:
            self.m.gpu_util.labels(**self.labels).set(torch.cuda.utilization(trainer.device) / 100.0)
            self.m.gpu_temp.labels(**self.labels).set(torch.cuda.temperature(trainer.device))
        except Exception:  # noqa: BLE001 - no NVML here: the series are simply not exported
            pass

    def finish(self, record) -> None:
        """The end of the run: model state by category (the untimed memory step), the NCCL
        environment check across ranks, the status."""
        m, lab = self.m, self.labels
        for state in (record.model_state or [])[:1]:  # rank 0's
            for cat in ("params", "grads", "optimizer", "master", "comm_buffer"):
                m.memory.labels(**lab, category=f"model_state_{cat}").set(getattr(state, f"{cat}_bytes"))
        m.nccl_disagree.labels(**lab).set(len(record.nccl_env_disagreement or []))
        m.finished.labels(**lab).set(1)
        m.ok.labels(**lab).set(1 if record.status == "ok" else 0)
        self._render()

    def close(self, hold_s: float = 0.0) -> None:
        """Serve the final values `hold_s` more seconds (so a scrape sees how the run ended), then stop."""
        if hold_s > 0:
            time.sleep(hold_s)
        self.server.shutdown()
        self.server.server_close()


def _rss_bytes() -> int | None:
    try:
        with open("/proc/self/statm") as f:
            import os

            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def start(cfg, record, rank: int):
    """The exporter when --metrics-port asks for one on this rank (rank 0), else None. A port
    that cannot be bound is a warning in the record, not a failed run: nothing measured is lost."""
    if cfg.metrics_port is None or rank != 0:
        return None
    try:
        return Exporter(cfg, record, cfg.metrics_port)
    except OSError as exc:
        record.warnings.append(f"metrics: could not serve on port {cfg.metrics_port}: {exc.strerror or exc}")
    except ImportError as exc:  # an image built without prometheus-client
        record.warnings.append(f"metrics: not served, prometheus-client missing ({exc})")
    return None
