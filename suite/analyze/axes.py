"""Settings compared as axes: for each measured knob that a result set varies beyond the layout
(float8, compile, a DDP hook, a bucket size, ...), the configurations whose measured settings are
equal except that knob ("same settings except float8"), each value against the knob's declared
default (the first value measured where the default was not), its tokens/s as a ratio with its
interval (suite/analyze/stats.py `ratio`, the same estimate `shardbench compare` prints) and
Welch's p. Verdicts compare layouts and scaling compares world sizes; this compares the rest.
"""
from __future__ import annotations

import json
from dataclasses import MISSING, dataclass, fields
from typing import Any

from shardbench.suite.analyze import groups, stats
from shardbench.suite.analyze.stats import Estimate
from shardbench.trainer import knobs
from shardbench.trainer.config import RunConfig

NOT_AXES = groups.VERDICT_EXCEPT | groups.LAYOUT | frozenset({"seq_len", "resolved_global_batch"})
"""Compared elsewhere: the layout (verdicts), the world size (scaling); the sequence length is its
own table row already (the report's configurations)."""


@dataclass
class AxisComparison:
    setting: str
    value: Any
    baseline: Any
    context: str
    """The group's other settings that differ between groups, in the flags' words."""
    configs: tuple[str, str]
    """Names of the value's and the baseline's configuration."""
    value_tokens_per_s: Estimate | None
    baseline_tokens_per_s: Estimate | None
    ratio: Estimate | None
    """tokens/s of the value over the baseline's, with its interval (needs two repeats each)."""
    p: float | None


_KNOBS = frozenset(f.name for f in fields(RunConfig))


def _default(name: str) -> Any:
    """The knob's declared default (trainer.knobs.default); None for a setting that is no knob."""
    value = knobs.default(name) if name in _KNOBS else None
    return None if value is MISSING else value


def _dump(v: Any) -> str:
    return json.dumps(v, default=str, sort_keys=True)


def compare(configs: list[Any], metric: str = "tokens_per_s") -> list[AxisComparison]:
    """Every (axis, value) against its baseline inside each group equal except that axis."""
    settings = [c.settings for c in configs]
    spec = groups.specific(settings)
    axes = [n for n in groups.differences(settings, NOT_AXES | spec)]
    out: list[AxisComparison] = []
    for axis in axes:
        except_ = NOT_AXES | spec | {axis}
        by_group: dict[str, list[Any]] = {}
        for c in configs:
            by_group.setdefault(groups.key(c.settings, except_), []).append(c)
        varying = groups.differences([groups.merged([c.settings for c in members]) for members in by_group.values()],
                                     except_)
        for members in by_group.values():
            by_value: dict[str, Any] = {}
            for c in members:
                by_value.setdefault(_dump(c.settings.get(axis)), c)
            if len(by_value) < 2:
                continue
            default = _dump(_default(axis))
            base_key = default if default in by_value else next(iter(by_value))
            base = by_value[base_key]
            context = ", ".join(s for n in varying if (s := groups.shown(n, base.settings.get(n))))
            for key, c in by_value.items():
                if key == base_key:
                    continue
                a, b = c.get(metric), base.get(metric)
                ratio = stats.ratio(a, b) if a is not None and b is not None else None
                p = stats.welch(a, b) if a is not None and b is not None else None
                out.append(AxisComparison(axis, c.settings.get(axis), base.settings.get(axis), context,
                                          (c.name, base.name), a, b, ratio, p))
    return out
