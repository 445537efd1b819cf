"""Live metrics of every rank for Prometheus (`--metrics-port`: rank r serves on port + its local
rank), read from the trainer's state when scraped.

Nothing here runs inside the timed step window. The trainer calls `after_step()` after the step
timer has stopped; it copies what the step left (plain Python numbers: step, loss, step time,
allocator counters, collective totals, checkpoint counts) into a fresh `Snapshot` and swaps the
reference, one assignment. A scrape renders that snapshot on the HTTP thread (`Collector`,
prometheus-client's custom-collector interface): it reads the reference once, takes no lock and
touches nothing the step uses, so a scrape that lands during a step sees the last finished step
at that moment, never an older rendering. /proc's resident size and NVML's utilisation and
temperature are read at scrape time (neither touches the device's streams or its allocator).
`tests/trainer/test_exporter.py` checks that a scrape during a step returns the last finished
step and that the step itself does no exporter work.

Names follow Prometheus conventions: the `shardbench_` prefix, base units in the name
(`_seconds`, `_bytes`, `_ratio`, `_celsius`), `_total` for counters; every series carries the
labels `run`, `strategy`, `shape` (the shape's values file name, or "none") and `rank`. Per-rank
series (step, loss, step time, memory, collectives, NCCL environment, GPU) come from every rank;
the run's own (settings, steps, throughput, checkpoints, restarts, status) from rank 0 only.
"""
from __future__ import annotations

import bisect
import hashlib
import json
import os
import time
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

LABELS = ("run", "strategy", "shape", "rank")
MEMORY_CATEGORIES = ("allocated", "reserved", "peak_allocated")


# Step times run from about a millisecond (tiny model on CPU) to tens of seconds (7B on GPUs):
# bounds 19% apart (2^(1/4)) from 1 ms to 2 minutes, so a quantile read from the histogram is
# within a few percent of the steps' (the 1 -> 2.5 -> 5 s bounds before overstated a p90 by 32%).
# Not centred on a predicted step time: a wrong expectation would put every step in one bucket.
STEP_BUCKETS = tuple(round(0.001 * 2 ** (k / 4), 6) for k in range(0, 69))


@dataclass(frozen=True)
class Snapshot:
    """What a scrape reports, as the last `after_step()` left it. Replaced whole, never changed
    in place, so the HTTP thread always reads one consistent state."""

    step: int = 0
    loss: float | None = None
    last_step_ts: float | None = None
    step_last_s: float | None = None
    tokens_per_s: float | None = None
    bucket_counts: tuple[int, ...] = ()
    step_sum: float = 0.0
    step_count: int = 0
    memory: dict[str, float] = field(default_factory=dict)
    comm: dict[str, tuple[int, int, float]] = field(default_factory=dict)
    ckpt_saves: int = 0
    ckpt_save_last_s: float | None = None
    ckpt_load_s: float | None = None
    restarts: int = 0
    finished: bool = False
    ok: bool = False
    nccl_disagreement: int | None = None


class Collector:
    """prometheus-client calls `collect()` on the HTTP thread at every scrape."""

    def __init__(self, exporter: "Exporter"):
        self.ex = exporter

    def describe(self):
        return []  # registered without a walk over the values

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

        ex, s = self.ex, self.ex.snap  # one read of the reference: a consistent state
        values = list(ex.labels.values())

        def gauge(name, doc, value, extra=None):
            extra = extra or {}
            fam = GaugeMetricFamily(name, doc, labels=list(ex.labels) + list(extra))
            fam.add_metric(values + list(extra.values()), value)
            return fam

        def counter(name, doc, value):
            fam = CounterMetricFamily(name, doc, labels=list(ex.labels))
            fam.add_metric(values, value)
            return fam

        yield gauge("shardbench_start_timestamp_seconds", "Unix time this rank's exporter started (before "
                    "rendezvous)", ex.started)
        yield gauge("shardbench_step", "Optimizer steps done (warm-up included; a resumed run counts on)", s.step)
        if s.last_step_ts is not None:
            yield gauge("shardbench_last_step_timestamp_seconds", "Unix time this rank's last step ended",
                        s.last_step_ts)
            yield gauge("shardbench_loss", "This rank's loss of the last step; the run's loss (the record's) "
                        "is the mean over ranks: avg without (rank, instance, pod)", s.loss)
        if s.step_last_s is not None:
            yield gauge("shardbench_step_last_seconds", "Time of this rank's last measured step "
                        "(checkpoint steps excluded, as in the record)", s.step_last_s)
        hist = HistogramMetricFamily("shardbench_step_duration_seconds", "Time of each measured step, "
                                     "checkpoint steps excluded as in the record", labels=list(ex.labels))
        cumulative, total = [], 0
        for bound, n in zip(ex.buckets, s.bucket_counts):
            total += n
            cumulative.append((repr(bound), total))
        cumulative.append(("+Inf", s.step_count))
        hist.add_metric(values, cumulative, s.step_sum)
        yield hist
        memory = GaugeMetricFamily("shardbench_memory_bytes", "This rank's memory by category",
                                   labels=list(ex.labels) + ["category"])
        mem = dict(s.memory)
        rss = _rss_bytes()
        if rss is not None:
            mem["rss"] = rss
        for category, value in mem.items():
            memory.add_metric(values + [category], value)
        yield memory
        comm = {k: CounterMetricFamily(f"shardbench_comm_{k}", doc, labels=list(ex.labels) + ["op"])
                for k, doc in (("calls", "Collective calls of measured steps"),
                               ("bytes", "Bytes of the collectives of measured steps"),
                               ("seconds", "Time at least one collective of the op was in flight in "
                                "measured steps (trainer/comm.py)"))}
        for op, (calls, nbytes, seconds) in s.comm.items():
            comm["calls"].add_metric(values + [op], calls)
            comm["bytes"].add_metric(values + [op], nbytes)
            comm["seconds"].add_metric(values + [op], seconds)
        yield from comm.values()
        yield gauge("shardbench_nccl_env_info", "1; nccl_env is a hash of this rank's NCCL_* variables (ranks "
                    "of one run that differ disagree)", 1, {"nccl_env": ex.nccl_env_hash})
        yield gauge("shardbench_finished", "1 once the run has ended on this rank (ok or not)", int(s.finished))
        yield from self._gpu(gauge)
        if not ex.run_level:
            return
        yield gauge("shardbench_run_info", "1 for the run; its settings as labels", 1, ex.info)
        yield gauge("shardbench_steps", "Optimizer steps the run will do", ex.steps)
        if ex.expected is not None:
            yield gauge("shardbench_expected_tokens_per_second", "The throughput this run is expected to reach "
                        "(--expected-tokens-per-s)", ex.expected)
        if s.tokens_per_s is not None:
            yield gauge("shardbench_tokens_per_second", "Global tokens/s of the last measured step (tokens per "
                        "step / its time; checkpoint steps excluded)", s.tokens_per_s)
        yield counter("shardbench_checkpoint_saves", "Checkpoints saved by the run (every attempt's)", s.ckpt_saves)
        yield counter("shardbench_restarts", "Times this run was restarted from a checkpoint", s.restarts)
        if s.ckpt_save_last_s is not None:
            yield gauge("shardbench_checkpoint_save_seconds", "Time of the last finished checkpoint save",
                        s.ckpt_save_last_s)
        if s.ckpt_load_s is not None:
            yield gauge("shardbench_checkpoint_load_seconds", "Time the resume's checkpoint load took", s.ckpt_load_s)
        if s.nccl_disagreement is not None:
            yield gauge("shardbench_nccl_env_disagreement", "NCCL_* variables whose values differ between ranks "
                        "(the record's count, at the end)", s.nccl_disagreement)
        if s.finished:
            yield gauge("shardbench_run_ok", "1 when the run ended with status ok (set at the end)", int(s.ok))

    def _gpu(self, gauge):
        """NVML utilisation and temperature of this rank's device (needs nvidia-ml-py); absent: no series."""
        device = self.ex.device
        if device is None or device.type != "cuda":
            return
        import torch

        try:
            util, temp = torch.cuda.utilization(device) / 100.0, torch.cuda.temperature(device)
        except Exception:  # noqa: BLE001 - no NVML here: the series are simply not exported
            return
        yield gauge("shardbench_gpu_utilization_ratio", "GPU utilisation of this rank's device (NVML)", util)
        yield gauge("shardbench_gpu_temperature_celsius", "GPU temperature of this rank's device (NVML)", temp)


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 - http.server's name
        if self.path.split("?")[0] not in ("/metrics", "/"):
            self.send_error(404)
            return
        from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

        body = generate_latest(self.server.exporter.registry)
        self.send_response(200)
        self.send_header("Content-Type", CONTENT_TYPE_LATEST)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):  # quiet: a rank's stderr is the run's log
        pass


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):
        """A scraper that gave up (its timeout) closed the socket: not worth a traceback in the
        rank's log, which is the run's log."""
        import sys

        if not isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
            super().handle_error(request, client_address)


class Exporter:
    """One rank's metrics endpoint. `after_step()` and `finish()` are called by the trainer
    outside the timed window; the server thread renders the current snapshot at each scrape."""

    def __init__(self, cfg, record, port: int, rank: int = 0, host: str = "0.0.0.0"):
        from prometheus_client import CollectorRegistry

        self.started = time.time()
        self.rank, self.run_level = rank, rank == 0
        self.labels = {"run": record.run_id, "strategy": record.strategy, "shape": record.gpu_shape or "none",
                       "rank": str(rank)}
        self.info = {"world_size": str(record.world_size), "launcher": str(record.launcher),
                     "model": str((record.model or {}).get("preset")), "precision": str(record.precision),
                     "device": str(record.device)}
        self.steps, self.expected = cfg.steps, cfg.expected_tokens_per_s
        self.tokens_per_step = record.tokens_per_step
        self.buckets = STEP_BUCKETS
        self.nccl_env_hash = _nccl_env_hash()
        self.device = None  # the trainer's, known from the first step
        self.snap = Snapshot(bucket_counts=(0,) * len(self.buckets))
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(Collector(self))
        self.server = _Server((host, port), _Handler)
        self.server.exporter = self  # type: ignore[attr-defined]
        self.port = self.server.server_address[1]
        import threading

        self._thread = threading.Thread(target=self.server.serve_forever, name="metrics", daemon=True)
        self._thread.start()

    # -- the trainer's thread, outside the timed window -------------------------------------------
    def after_step(self, trainer, step: int, dt: float, loss: float, measured: bool) -> None:
        """A new snapshot from what the step left: plain numbers, no rendering, no device sync."""
        self.device = trainer.device
        s = self.snap
        new = {"step": step + 1, "loss": loss, "last_step_ts": time.time()}
        # The loop appends a measured step's dt to history.step_times unless it was a checkpoint
        # step (the record leaves those out): this very float object is then the list's last.
        times = trainer.history.step_times
        if measured and times and times[-1] is dt:
            counts = list(s.bucket_counts)
            i = bisect.bisect_left(self.buckets, dt)
            if i < len(counts):
                counts[i] += 1
            new.update(step_last_s=dt, bucket_counts=tuple(counts), step_sum=s.step_sum + dt,  # type: ignore[call-overload]
                       step_count=s.step_count + 1)
            if self.tokens_per_step:
                new["tokens_per_s"] = self.tokens_per_step / dt
        new["comm"] = _comm_totals() if measured else s.comm  # type: ignore[assignment]
        new["memory"] = _memory(trainer.device)  # type: ignore[assignment]
        new.update(_checkpoints(trainer))
        self.snap = replace(s, **new)  # type: ignore[arg-type]

    def finish(self, record) -> None:
        """The end of the run: this rank's model state by category (the untimed memory step), the
        NCCL environment check across ranks, the status."""
        s = self.snap
        memory = dict(s.memory)
        states = record.model_state or []
        if self.rank < len(states):
            for cat in ("params", "grads", "optimizer", "master", "comm_buffer"):
                memory[f"model_state_{cat}"] = getattr(states[self.rank], f"{cat}_bytes")
        self.snap = replace(s, memory=memory, finished=True, ok=record.status == "ok",
                            nccl_disagreement=len(record.nccl_env_disagreement or []) if self.run_level else None)

    def close(self, hold_s: float = 0.0) -> None:
        """Serve the final values `hold_s` more seconds (so a scrape sees how the run ended), then stop."""
        if hold_s > 0:
            time.sleep(hold_s)
        self.server.shutdown()
        self.server.server_close()


def _comm_totals() -> dict[str, tuple[int, int, float]]:
    """The collective counter's running totals (trainer/comm.py), copied."""
    from shardbench.trainer.comm import COUNTER

    return {op: (COUNTER.calls.get(op, 0), COUNTER.bytes.get(op, 0), COUNTER.seconds.get(op, 0.0))
            for op in list(COUNTER.calls)}


def _memory(device) -> dict[str, float]:
    """Allocator counters on GPU (cheap reads, no sync). Read here, not at scrape time: they take
    the allocator's lock, which the step needs."""
    if device is None or device.type != "cuda":
        return {}
    import torch

    return {"allocated": torch.cuda.memory_allocated(device), "reserved": torch.cuda.memory_reserved(device),
            "peak_allocated": torch.cuda.max_memory_allocated(device)}


def _checkpoints(trainer) -> dict:
    out = {"restarts": trainer.history.restarts}
    if trainer.ckpt is None:
        return out
    st = trainer.ckpt.ckpt.stats  # trainer.history.CheckpointHooks around the Checkpointer
    out.update(ckpt_saves=st.saves, ckpt_load_s=st.load_s)
    if st.save_s:
        out["ckpt_save_last_s"] = st.save_s[-1]
    return out


def _nccl_env_hash() -> str:
    """Known from the start, unlike the record's cross-rank check at the end: ranks of one run
    whose hashes differ disagree (the NCCLEnvDisagreement alert counts distinct hashes)."""
    from shardbench.trainer.env_info import nccl_env

    return hashlib.sha1(json.dumps(nccl_env(), sort_keys=True).encode()).hexdigest()[:12]


def _rss_bytes() -> int | None:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def start(cfg, record, rank: int, local_rank: int = 0):
    """This rank's exporter when --metrics-port asks for one (port + the local rank, so the ranks
    of one node do not collide; 0: any free port), else None. A port that cannot be bound is a
    warning in the record, not a failed run: nothing measured is lost."""
    if cfg.metrics_port is None:
        return None
    port = cfg.metrics_port + local_rank if cfg.metrics_port else 0
    try:
        return Exporter(cfg, record, port, rank)
    except OSError as exc:
        record.warnings.append(f"metrics: could not serve on port {port}: {exc.strerror or exc}")
    except ImportError as exc:  # an image built without prometheus-client
        record.warnings.append(f"metrics: not served, prometheus-client missing ({exc})")
    return None
