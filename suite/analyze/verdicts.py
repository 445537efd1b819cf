"""The winner rule, the noise rule and the repeats hint (README "How the report decides").

Winner: in a comparison group (all measured settings equal except the strategy, suite/analyze/groups.py)
every configuration is a candidate. The best mean is named only when Welch's t test (on the log
scale, suite/stats.welch) separates it from EVERY other candidate, the k - 1 p values passing
Holm's step-down correction at a family-wise 5%. With all candidates equal, a winner is named in
at most 5% of groups (tests/suite/test_verdicts.py simulates it for 2 to 5 candidates).
Memory is counted, not timed: its values do not vary between repeats, so one repeat decides and
the smallest value wins outright (a value that did vary is tested like a timing).

Noise: a configuration whose throughput's coefficient of variation (sd / mean) exceeds
NOISE_CV_LIMIT is flagged. The sample CV estimates a fixed quantity, so more repeats make the
flag rarer for a configuration whose real noise is below the limit (the old (max - min) / mean
grew with n: at 10% noise it flagged 33% of configurations at n=3 and 92.5% at n=10).

Repeats hint: the fewest repeats per configuration at which the rule above names the better of
two means with probability >= POWER, given their gap and the noise measured here (normal
approximation of the noncentral t, at Holm's strictest level alpha / (k - 1)); checked by
simulation in the tests.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from shardbench.suite.analyze.stats import Estimate, t_quantile, welch

ALPHA = 0.05
POWER = 0.80
NOISE_CV_LIMIT = 0.25
MAX_REPEATS = 100
MIN_REPEATS = 3  # what to ask for when the data cannot say how many repeats a comparison needs


@dataclass
class Verdict:
    category: Any
    """analysis.Category."""
    group: str
    kind: str
    """winner, no significant difference, one repeat, flagged, equal."""
    best: Any
    """analysis.MeasuredConfig with the best mean."""
    second: Any
    """The runner-up (closest to the best)."""
    margin_pct: float
    text: str
    candidates: list[Any] = field(default_factory=list)
    """Every configuration compared, best first."""
    pvalues: list[float | None] = field(default_factory=list)
    """Welch p of the best against each other candidate, in candidates' order (after the best)."""
    repeats_hint: int | None = None
    tied: list[Any] = field(default_factory=list)
    """The candidates the data does not separate from the best, the best first: equal values when
    counted, Welch/Holm not rejecting when timed; [best] for a winner, [] when undecided."""

    def rel(self, c: Any) -> float:
        """c's value relative to the best's: (c - best) / best (0.25 = 25% more)."""
        b = self.best.get(self.category.metric).mean
        return (c.get(self.category.metric).mean - b) / abs(b) if b else math.nan


def _normal_sf(x: float) -> float:
    return 0.5 * math.erfc(x / math.sqrt(2.0))


def power(gap_ratio: float, cv: float, n: int, candidates: int = 2) -> float:
    """Probability that Welch's test at alpha / (candidates - 1) separates two means whose ratio
    is gap_ratio, each with n repeats of relative sd cv (normal approximation of the noncentral
    t, with the t_crit^2 / 2df correction for small df)."""
    if n < 2 or cv <= 0:
        return 1.0 if cv == 0 and gap_ratio != 1 else 0.0
    df = 2.0 * (n - 1)
    level = ALPHA / max(1, candidates - 1)
    crit = t_quantile(1 - level / 2, df)
    delta = abs(math.log(gap_ratio)) / (cv * math.sqrt(2.0 / n))
    return _normal_sf((crit - delta) / math.sqrt(1 + crit ** 2 / (2 * df)))


def repeats_needed(a: float, b: float, cv: float | None, candidates: int = 2, limit: int = MAX_REPEATS) -> int | None:
    """Fewest repeats per configuration for POWER at this gap and noise; None when cv is unknown,
    the means are not both positive, or more than `limit` would be needed."""
    if cv is None or not math.isfinite(cv) or a <= 0 or b <= 0 or a == b:
        return None
    for n in range(2, limit + 1):
        if power(a / b, cv, n, candidates) >= POWER:
            return max(n, 2)
    return None


def noise_flag(e: Estimate | None) -> str | None:
    """The noise flag of a throughput estimate, or None."""
    if e is None or e.cv is None or e.cv <= NOISE_CV_LIMIT:
        return None
    return f"throughput noisy: sd/mean {e.cv:.0%} across {e.n} repeats (> {NOISE_CV_LIMIT:.0%})"


def _exact(e: Estimate) -> bool:
    return e.sd is None or e.sd == 0


def host_note(c: Any, cat: Any, short: bool = False) -> str:
    """' (+ 0.01 GiB in host memory)' after a device-memory value whose configuration keeps state
    on the host (every line that states one: the winner's, the others', the summary's), else ''."""
    host = c.get("model_state_host_gib") if cat.metric == "model_state_device_gib" else None
    if host is None or not host.mean:
        return ""
    # a CPU run's device holds it all (one memory): the host part is of it, not beside it
    device, total = c.get(cat.metric), c.get("model_state_gib_per_rank")
    within = device is not None and total is not None and device.mean >= total.mean
    if short:
        return f" (of it {host.mean:.4g} GiB host)" if within else f" (+ {host.mean:.4g} GiB host)"
    return (f" (of it {host.mean:.4g} GiB placed in host memory: one memory here)" if within
            else f" (+ {host.mean:.4g} GiB in host memory)")


def describe(c: Any, cat: Any) -> str:
    """'ddp `ddp-w2-s64-mb4-ga1-1a2b3c4d` 1,000 [975, 1,025] tok/s (n=3)': which configuration, what number."""
    return f"{c.strategy} `{c.name}` {cat.show(c.get(cat.metric))}{host_note(c, cat)}"


def decide(cat: Any, group: list[Any], label: str, cv: float | None) -> Verdict | None:
    """The verdict of one category in one comparison group; cv: the metric's noise here (for the hint)."""
    sign = -1 if cat.higher_is_better else 1
    cands = [c for c in group if c.get(cat.metric) is not None
             and not (cat.metric == "scaling_efficiency" and c.base_world_size == int(c.world_size))]
    if len(cands) < 2:
        return None
    cands.sort(key=lambda c: sign * c.get(cat.metric).mean)
    best, second = cands[0], cands[1]
    b, s = best.get(cat.metric), second.get(cat.metric)
    margin = abs(b.mean - s.mean) / abs(s.mean) * 100 if s.mean else math.nan
    others = "; ".join(describe(c, cat) for c in cands[1:])
    v = Verdict(cat, label, "", best, second, margin, "", cands)
    blocking = best.flags if cat.timed else [f for f in best.flags if f.startswith("broken")]
    if blocking:
        v.kind, v.text = "flagged", (f"not named: {describe(best, cat)} has the best mean but is flagged "
                                     f"({'; '.join(blocking)}); vs {others}")
        return v
    if not cat.timed and all(_exact(c.get(cat.metric)) for c in cands):
        return _counted(v, cat, others)
    cv_here = _cv(b, s, cv)
    if not all(c.get(cat.metric).has_interval for c in cands):
        v.repeats_hint = repeats_needed(abs(b.mean), abs(s.mean), cv_here, len(cands))
        v.kind = "one repeat"
        v.text = f"no winner from one repeat: {describe(best, cat)} vs {others}; {_hint(v, b, s, cv_here)}"
        return v
    v.pvalues = [welch(b, c.get(cat.metric)) for c in cands[1:]]
    separated = holm_rejected(v.pvalues, ALPHA)
    v.tied = [best] + [c for c, sep in zip(cands[1:], separated) if not sep]
    if all(separated):
        word = "higher" if b.mean > s.mean else "lower"
        v.kind = "winner"
        v.text = (f"**{best.strategy}** `{best.name}` {cat.show(b)}{host_note(best, cat)}, {margin:.1f}% {word} than "
                  f"{describe(second, cat)}{_rest(cands, cat)}; Welch p {_ps(v.pvalues)} "
                  f"(Holm, {ALPHA:.0%} family-wise over {len(cands) - 1} comparison(s))")
    else:
        v.kind = "no significant difference"
        v.repeats_hint = repeats_needed(abs(b.mean), abs(s.mean), cv_here, len(cands))
        v.text = (f"no significant difference: {describe(best, cat)} vs {others} "
                  f"(Welch p {_ps(v.pvalues)}, Holm at {ALPHA:.0%}); {_hint(v, b, s, cv_here)}")
    return v


def _counted(v: Verdict, cat: Any, others: str) -> Verdict:
    b, s = v.best.get(cat.metric), v.second.get(cat.metric)
    v.tied = [c for c in v.candidates if c.get(cat.metric).mean == b.mean]
    if len(v.tied) > 1:
        rest = v.candidates[len(v.tied):]
        v.kind = "equal"
        v.text = (f"equal: {' = '.join(str(c.strategy) for c in v.tied)} at {cat.show(b)}"
                  + (f"; then {'; '.join(f'{describe(c, cat)} ({pct(v.rel(c))})' for c in rest)}" if rest else "")
                  + " (counted, not timed)")
        return v
    word = "higher" if b.mean > s.mean else "lower"
    v.kind = "winner"
    v.text = (f"**{v.best.strategy}** `{v.best.name}` {cat.show(b)}{host_note(v.best, cat)}, {v.margin_pct:.1f}% "
              f"{word} than "
              f"{describe(v.second, cat)}{_rest(v.candidates, cat)} (counted, not timed: one repeat decides)")
    return v


def holm_rejected(pvalues: list[float | None], alpha: float) -> list[bool]:
    """Holm's step-down per hypothesis: True where it rejects "equal" at family-wise level alpha
    (the i-th smallest p must be <= alpha / (m - i), and every smaller p rejected first). A missing
    p rejects nothing."""
    if any(p is None for p in pvalues):
        return [False] * len(pvalues)
    order = sorted(range(len(pvalues)), key=lambda i: pvalues[i])  # type: ignore[arg-type,return-value]
    out, m = [False] * len(pvalues), len(pvalues)
    for rank, i in enumerate(order):
        if pvalues[i] > alpha / (m - rank):  # type: ignore[operator]
            break
        out[i] = True
    return out


def pct(x: float) -> str:
    """'+25%', '-3.2%', '+0.04%': a relative difference never rounded to a false zero."""
    if not math.isfinite(x):
        return "?"
    a = abs(x) * 100
    digits = 0 if a >= 9.5 else 1 if a >= 0.95 else 2
    return f"{x * 100:+.{digits}f}%"


def _cv(b: Estimate, s: Estimate, pooled: float | None) -> float | None:
    """The noise of this comparison: the two candidates' own CVs when both have them, else pooled."""
    if b.cv is not None and s.cv is not None and b.n > 1 and s.n > 1:
        return math.sqrt((b.cv ** 2 + s.cv ** 2) / 2)
    return pooled


def _hint(v: Verdict, b: Estimate, s: Estimate, cv: float | None) -> str:
    if b.mean == s.mean:
        return "the means are equal"
    if v.repeats_hint:
        return (f"about {v.repeats_hint} repeats each would name the better one {POWER:.0%} of the time "
                f"if the gap is real (noise {cv:.1%})")
    if cv is None:
        return f"rerun with at least {MIN_REPEATS} repeats"
    return f"the difference is within the noise even at {MAX_REPEATS} repeats"


def _rest(cands: list[Any], cat: Any) -> str:
    return "" if len(cands) <= 2 else " and " + "; ".join(describe(c, cat) for c in cands[2:])


def _ps(ps: list[float | None]) -> str:
    return ", ".join("-" if p is None else f"{p:.2g}" for p in ps)
