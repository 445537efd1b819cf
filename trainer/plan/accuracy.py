"""Predicted vs measured for one record (torch-free): relative errors per category, what the
report's error table and the accuracy tests read. error = predicted / measured - 1."""
from __future__ import annotations


def _rel(pred, meas) -> float | None:
    if pred is None or not meas:
        return None
    return pred / meas - 1


def measured_state(record: dict) -> int | None:
    """Model state without communication buffers, max over ranks (what the planner's
    params + grads + optimizer + master predict)."""
    ranks = record.get("model_state") or []
    return max((m["total_bytes"] - m.get("comm_buffer_bytes", 0) for m in ranks), default=None)


def measured_comm_seconds(record: dict) -> float | None:
    """Seconds per step collectives were in flight, summed over ops (trainer/comm.py; records
    before it have none). It includes waiting for the other ranks: the alpha-beta model does not."""
    ops = (record.get("comm_per_step") or {}).values()
    seconds = [v.get("seconds") for v in ops]
    return sum(seconds) if seconds and all(isinstance(x, (int, float)) for x in seconds) else None


def errors(prediction: dict, record: dict) -> dict[str, float | None]:
    """state, peak, comm (the worst op among those carrying >= 1% of the step's bytes), comm_time
    (modeled collective seconds against measured in-flight seconds), step."""
    out = {"state": _rel(prediction.get("model_state_bytes"), measured_state(record)),
           "peak": _rel(prediction.get("tensor_peak_bytes"), record.get("tensor_peak_bytes"))}
    measured, predicted = record.get("comm_per_step") or {}, prediction.get("comm_per_step") or {}
    total = sum(v["bytes"] for v in measured.values())
    worst = None
    for op, v in measured.items():
        if total and v["bytes"] >= 0.01 * total:
            e = _rel((predicted.get(op) or {}).get("bytes", 0.0), v["bytes"])
            if worst is None or abs(e) > abs(worst):  # type: ignore[arg-type]
                worst = e
    out["comm"] = worst
    out["comm_time"] = _rel((prediction.get("step_time") or {}).get("comm_s"), measured_comm_seconds(record))
    step = (prediction.get("step_time") or {}).get("seconds")
    out["step"] = _rel(step, (record.get("step_time_s") or {}).get("mean"))
    return out
