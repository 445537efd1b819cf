"""Summary statistics that survive noise: n, mean, sd and a 95% Student-t interval.

`estimate` summarizes repeats of one measurement. `ratio` propagates the spread of two estimates
into their ratio (scaling efficiency, speedup) with the delta method: the relative variances of
the two means add, se(r)/r = sqrt(sd_a^2/(n_a a^2) + sd_b^2/(n_b b^2)), and the interval uses
Student t with Welch-Satterthwaite degrees of freedom. `separated` is the winner rule: two
intervals that do not overlap. No scipy: the t quantiles are tabulated.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Iterable

# Two-sided 95% Student-t quantiles t(0.975, df), df = 1..30 (any statistics table).
_T975 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
         2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
         2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042]
_Z975 = 1.959964


def t975(df: float) -> float:
    """t(0.975, df); a fractional df rounds down (a slightly wider, conservative interval)."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {df}")
    if df <= len(_T975):
        return _T975[int(df) - 1]
    z = _Z975  # Cornish-Fisher expansion: within 1e-3 of the exact value above df 30
    return z + (z ** 3 + z) / (4 * df) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * df ** 2)


@dataclass(frozen=True)
class Estimate:
    """A mean over n repeats with its 95% interval; sd and half are None below 2 repeats."""

    n: int
    mean: float
    sd: float | None = None
    half: float | None = None
    """Half-width of the 95% confidence interval of the mean."""

    @property
    def lo(self) -> float | None:
        return None if self.half is None else self.mean - self.half

    @property
    def hi(self) -> float | None:
        return None if self.half is None else self.mean + self.half

    @property
    def has_interval(self) -> bool:
        return self.half is not None

    @property
    def rel_half(self) -> float | None:
        """Half-width relative to the mean (None without an interval or at mean 0)."""
        return None if self.half is None or not self.mean else abs(self.half / self.mean)


def finite(x: object) -> bool:
    """A real number (numpy's included), not bool, not NaN or infinite."""
    return isinstance(x, numbers.Real) and not isinstance(x, bool) and math.isfinite(x)


def estimate(values: Iterable[float]) -> Estimate | None:
    """n, mean, sample sd and 95% t interval of the finite values; None when there are none."""
    xs = [float(v) for v in values if finite(v)]
    if not xs:
        return None
    n = len(xs)
    mean = math.fsum(xs) / n
    if n < 2:
        return Estimate(1, mean)
    sd = math.sqrt(math.fsum((x - mean) ** 2 for x in xs) / (n - 1))
    return Estimate(n, mean, sd, t975(n - 1) * sd / math.sqrt(n))


def ratio(num: Estimate, den: Estimate, scale: float = 1.0) -> Estimate | None:
    """scale x num/den with the delta-method interval; None when den's mean is 0.

    n is the smaller of the two; without two repeats on both sides there is no interval. sd is
    the propagated standard error x sqrt(n), so that sd / sqrt(n) is the ratio's standard error."""
    if not den.mean:
        return None
    r = scale * num.mean / den.mean
    n = min(num.n, den.n)
    if num.sd is None or den.sd is None or not num.mean:
        return Estimate(n, r)
    ua = (num.sd / num.mean) ** 2 / num.n  # relative variance of each mean
    ub = (den.sd / den.mean) ** 2 / den.n
    u = ua + ub
    if u == 0:
        return Estimate(n, r, 0.0, 0.0)
    df = u ** 2 / (ua ** 2 / (num.n - 1) + ub ** 2 / (den.n - 1))
    se = abs(r) * math.sqrt(u)
    return Estimate(n, r, se * math.sqrt(n), t975(df) * se)


def separated(a: Estimate, b: Estimate) -> bool:
    """True when both have intervals and they do not overlap."""
    if not (a.has_interval and b.has_interval):
        return False
    return a.lo > b.hi or b.lo > a.hi  # type: ignore[operator]


def repeats_needed(a: float, b: float, cv: float | None, limit: int = 100) -> int | None:
    """Fewest repeats per side whose 95% intervals would separate means a and b, if each had
    relative sd `cv`; None when cv is unknown or more than `limit` would be needed."""
    if cv is None or not finite(cv):
        return None
    gap = abs(a - b)
    for n in range(2, limit + 1):
        if t975(n - 1) * cv * (abs(a) + abs(b)) / math.sqrt(n) < gap:
            return n
    return None
