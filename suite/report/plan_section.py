"""The report's plan section: every run's prediction (the record's `prediction`, made by
`shardbench run` before launch) beside its measurement, with the error per category
(predicted / measured - 1; trainer/plan/accuracy.py), and the assumptions the plans rest on."""
from __future__ import annotations

from shardbench.trainer.plan.accuracy import errors, measured_comm_seconds, measured_state

MiB = 2 ** 20


def _mib(x) -> str:
    return "-" if x is None else f"{x / MiB:.1f}"


def _n(x) -> str:
    return "-" if x is None else f"{x:g}"


def _pct(x) -> str:
    return "-" if x is None else f"{x:+.1%}"


def _pair(pred, meas) -> str:
    return "-" if pred is None else f"{pred:.3g} / " + ("-" if meas is None else f"{meas:.3g}")


_SAME = ("strategy", "seq_len", "micro_batch", "grad_accum", "precision", "device", "gpu_shape")


def _key(r: dict) -> tuple:
    """What a world-size-1 calibration run must share with the run it calibrates."""
    return (repr(r.get("model")),) + tuple(repr(r.get(k)) for k in _SAME)


def fastest_bases(records: list[dict]) -> dict[tuple, dict]:
    """The fastest ok world-size-1 run per configuration (`_key`), in one pass over the records:
    looking it up per run made the report quadratic (5,000 records: 17 s in this section alone)."""
    best: dict[tuple, dict] = {}
    for b in records:
        if b.get("status") == "ok" and b.get("world_size") == 1 and b.get("tokens_per_s"):
            k = _key(b)
            if k not in best or b["tokens_per_s"] > best[k]["tokens_per_s"]:
                best[k] = b
    return best


def _calibrated(p: dict, r: dict, bases: dict[tuple, dict]) -> dict:
    """The prediction with its step time calibrated from the fastest ok world-size-1 run of the
    same configuration in this result set (`fastest_bases`; compute rate achieved there; timing.py)."""
    from shardbench.trainer.plan import timing
    from shardbench.trainer.plan.inputs import PlanInput

    best = bases.get(_key(r))
    if best is None:
        return p
    cal = {"achieved_flops": timing.achieved_flops(best),
           "source": f"calibrated on {best.get('run_id')}"}
    try:
        step = timing.step_time(PlanInput(**p["input"]), p.get("comm_per_step") or {}, p.get("links") or {}, cal,
                                p.get("comm_per_step_by_dim"))  # a mesh layout: each dimension on its link
    except (TypeError, KeyError):
        return p
    return {**p, "step_time": step}


def rows(records: list[dict]) -> list[list[str]]:
    out, bases = [], fastest_bases(records)
    for r in sorted(records, key=lambda r: r.get("run_id") or ""):
        p = r.get("prediction")
        if r.get("status") != "ok" or not isinstance(p, dict):
            continue
        if p.get("not_modelled") or p.get("error"):  # a layout the planner has no model of, or a failed plan
            why = f"not modelled: {p['not_modelled']}" if p.get("not_modelled") else f"no plan: {p['error']}"
            out.append([r.get("run_id", ""), why] + ["-"] * 9)
            continue
        p = _calibrated(p, r, bases)
        e = errors(p, r)
        step = (p.get("step_time") or {}).get("seconds")
        measured_step = (r.get("step_time_s") or {}).get("mean")
        gpu = r.get("device") == "cuda"
        peak_pred = p.get("peak_bytes") if gpu else p.get("tensor_peak_bytes")
        peak_meas = r.get("peak_memory_bytes") if gpu else r.get("tensor_peak_bytes")
        peak_err = (peak_pred / peak_meas - 1) if peak_pred and peak_meas else None
        fits = {True: "yes", False: "NO", None: "?"}[p.get("fits")]
        comm_s = _pair((p.get("step_time") or {}).get("comm_s"), measured_comm_seconds(r))
        out.append([r.get("run_id", ""), f"{_mib(p.get('model_state_bytes'))} / {_mib(measured_state(r))}",
                    _pct(e["state"]), f"{_mib(peak_pred)} / {_mib(peak_meas)}", _pct(peak_err), _pct(e["comm"]),
                    comm_s, _pct(e["comm_time"]), _pair(step, measured_step), _pct(e["step"]), fits])
    return out


def markdown(records: list[dict]) -> str:
    head = "## Plan vs measurement\n\n"
    table = rows(records)
    if not table:
        return head + ("No ok record carries a prediction (runs made with `shardbench run --no-plan`, or "
                       "before the planner): `shardbench plan` predicts them (docs/planner.md).")
    cols = ["run", "model state MiB pred / meas", "err", "peak MiB pred / meas", "err", "comm bytes err (worst op)",
            "comm s pred / meas", "err", "step s pred / meas", "err", "fits"]
    lines = ["| " + " | ".join(cols) + " |", "| " + " | ".join("---" for _ in cols) + " |"]
    lines += ["| " + " | ".join(row) + " |" for row in table]
    assumptions = sorted({a for r in records if isinstance(r.get("prediction"), dict)
                          for a in r["prediction"].get("assumptions", [])})
    note = ("Step time: compute calibrated on the fastest world-size-1 run of the same configuration in "
            "this result set, plus exposed alpha-beta communication (docs/planner.md). "
            "Comm s: the modeled collective time against the time collectives were in flight, summed "
            "over ops (trainer/comm.py), which also holds waiting for slower ranks. "
            "Peak: on GPU the predicted peak with allocator overhead against max allocated; on CPU the "
            "predicted tensor peak against the live-tensor peak of the untimed memory step. err = "
            "predicted / measured - 1.\n\n")
    return (head + note + "\n".join(lines) + mesh_markdown(records) + "\n\nAssumptions:\n\n"
            + "\n".join(f"- {a}" for a in assumptions))


def mesh_rows(records: list[dict]) -> list[list[str]]:
    """Mesh layouts (trainer/parallel/): per run, dimension and op, the predicted calls and bytes
    beside the counted ones (the record's comm_per_step_by_dim), and what the dimension divides."""
    out = []
    for r in sorted(records, key=lambda r: r.get("run_id") or ""):
        p, measured = r.get("prediction"), r.get("comm_per_step_by_dim") or {}
        if r.get("status") != "ok" or not isinstance(p, dict) or not measured:
            continue
        predicted = p.get("comm_per_step_by_dim") or {}
        divides = r.get("memory_by_dim") or p.get("memory_by_dim") or {}
        for dim in sorted(set(measured) | set(predicted)):
            what = ", ".join((divides.get(dim) or {}).get("divides") or []) or "-"
            degree = (divides.get(dim) or {}).get("degree", "?")
            for op in sorted(set(measured.get(dim, {})) | set(predicted.get(dim, {}))):
                m, q = measured.get(dim, {}).get(op, {}), predicted.get(dim, {}).get(op, {})
                err = q["bytes"] / m["bytes"] - 1 if q.get("bytes") is not None and m.get("bytes") else None
                out.append([r.get("run_id", ""), f"{dim} ({degree})", what, op,
                            f"{_n(q.get('calls'))} / {_n(m.get('calls'))}",
                            f"{_mib(q.get('bytes'))} / {_mib(m.get('bytes'))}", _pct(err)])
    return out


def mesh_markdown(records: list[dict]) -> str:
    table = mesh_rows(records)
    if not table:
        return ""
    cols = ["run", "mesh dimension (degree)", "divides", "op", "calls pred / meas", "MiB pred / meas", "err"]
    lines = ["| " + " | ".join(cols) + " |", "| " + " | ".join("---" for _ in cols) + " |"]
    return ("\n\nCollectives and memory per mesh dimension (tensor parallel's activation collectives on tp, "
            "data parallel's gradient ones on dp_shard / dp_replicate; trainer/plan/mesh_forms.py):\n\n"
            + "\n".join(lines + ["| " + " | ".join(row) + " |" for row in table]))
