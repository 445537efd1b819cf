"""Summary statistics that survive noise: n, mean, sd and a 95% interval, and the test behind a
winner.

`estimate` summarizes repeats of one measurement. Intervals of positive quantities (tokens/s,
seconds, bytes, ratios) are taken on a log scale: mean x exp(+-t x (sd/mean)/sqrt(n)) (the delta
method on log of the mean), so they are never negative and a ratio's interval is symmetric in
log space. `ratio` propagates the spread of two estimates into their ratio (scaling efficiency,
speedup): the relative variances of the two means add, u = sd_a^2/(n_a a^2) + sd_b^2/(n_b b^2),
with Welch-Satterthwaite degrees of freedom. `welch` is the same arithmetic as a test: the
two-sided p value of log(a/b) = 0. Student t quantiles and probabilities are computed (the
regularized incomplete beta function), so fractional degrees of freedom are exact, not rounded.
No scipy.
"""
from __future__ import annotations

import functools
import math
import numbers
from dataclasses import dataclass
from typing import Iterable


# --- Student t ------------------------------------------------------------------------------

def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta function (Numerical Recipes 6.4, modified Lentz)."""
    tiny, qab, qap, qam = 1e-300, a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        m2 = 2 * m
        for aa in (m * (b - m) * x / ((qam + m2) * (a + m2)), -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))):
            d = 1.0 + aa * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + aa / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
            if aa == 0 or abs(d * c - 1.0) < 1e-15:
                break
        if abs(d * c - 1.0) < 1e-15:
            break
    return h


def _betainc(a: float, b: float, x: float) -> float:
    """Regularized incomplete beta I_x(a, b)."""
    if x <= 0:
        return 0.0
    if x >= 1:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1) / (a + b + 2):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_sf2(t: float, df: float) -> float:
    """Two-sided tail probability P(|T| > |t|) of Student t with df (fractional allowed) degrees of freedom."""
    if not math.isfinite(t):
        return 0.0
    return _betainc(df / 2.0, 0.5, df / (df + t * t))


@functools.lru_cache(maxsize=8192)
def t_quantile(p: float, df: float) -> float:
    """The p quantile (p > 0.5) of Student t with df > 0 degrees of freedom, by bisection."""
    if df <= 0:
        raise ValueError(f"degrees of freedom must be > 0, got {df}")
    tail = 2.0 * (1.0 - p)
    lo, hi = 0.0, 1.0
    while t_sf2(hi, df) > tail:
        hi *= 2.0
    for _ in range(200):
        mid = (lo + hi) / 2.0
        if t_sf2(mid, df) > tail:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-12 * max(1.0, hi):
            break
    return (lo + hi) / 2.0


def t975(df: float) -> float:
    """t(0.975, df), exact for fractional df (the old table rounded df down)."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {df}")
    return t_quantile(0.975, round(float(df), 9))


# --- estimates ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Estimate:
    """A mean over n repeats with its 95% interval [lo, hi]; sd, lo and hi are None below 2 repeats."""

    n: int
    mean: float
    sd: float | None = None
    lo: float | None = None
    hi: float | None = None

    @property
    def has_interval(self) -> bool:
        return self.lo is not None and self.hi is not None

    @property
    def half(self) -> float | None:
        """Half the interval's width (the interval is not symmetric on a log scale)."""
        return None if not self.has_interval else (self.hi - self.lo) / 2  # type: ignore[operator]

    @property
    def cv(self) -> float | None:
        """sd / mean across the repeats (does not grow with n, unlike max - min)."""
        return None if self.sd is None or not self.mean else abs(self.sd / self.mean)


def finite(x: object) -> bool:
    """A real number (numpy's included), not bool, not NaN or infinite."""
    return isinstance(x, numbers.Real) and not isinstance(x, bool) and math.isfinite(x)


def interval(mean: float, sd: float, n: int, t: float) -> tuple[float, float]:
    """The 95% interval of a mean: on a log scale for a positive mean, else additive."""
    se = sd / math.sqrt(n)
    if mean > 0:
        f = math.exp(t * se / mean)
        return mean / f, mean * f
    return mean - t * se, mean + t * se


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
    lo, hi = interval(mean, sd, n, t975(n - 1))
    return Estimate(n, mean, sd, lo, hi)


def exact(n: int, value: float) -> Estimate:
    """An estimate without spread (a definition, e.g. the base's efficiency 1.0)."""
    return Estimate(n, value, 0.0, value, value) if n > 1 else Estimate(1, value)


def _welch_parts(a: Estimate, b: Estimate) -> tuple[float, float, float] | None:
    """(relative variance of a's mean, of b's, Welch df) or None without spreads."""
    if a.sd is None or b.sd is None or not a.mean or not b.mean or a.n < 2 or b.n < 2:
        return None
    ua, ub = (a.sd / a.mean) ** 2 / a.n, (b.sd / b.mean) ** 2 / b.n
    u = ua + ub
    if u == 0:
        return ua, ub, math.inf
    return ua, ub, u ** 2 / (ua ** 2 / (a.n - 1) + ub ** 2 / (b.n - 1))


def ratio(num: Estimate, den: Estimate, scale: float = 1.0) -> Estimate | None:
    """scale x num/den with the delta-method interval on a log scale; None when den's mean is 0.

    n is the smaller of the two; without two repeats on both sides there is no interval. sd is
    the propagated standard error x sqrt(n), so that sd / sqrt(n) is the ratio's standard error."""
    if not den.mean:
        return None
    r = scale * num.mean / den.mean
    n = min(num.n, den.n)
    parts = _welch_parts(num, den)
    if parts is None:
        return Estimate(n, r)
    ua, ub, df = parts
    if ua + ub == 0:
        return exact(n, r)
    se = abs(r) * math.sqrt(ua + ub)
    lo, hi = interval(r, se * math.sqrt(n), n, t975(max(1.0, df)))
    return Estimate(n, r, se * math.sqrt(n), lo, hi)


def welch(a: Estimate, b: Estimate) -> float | None:
    """Two-sided p value of 'a and b have the same mean' (Welch's t on the log scale, i.e. on the
    ratio a/b, with the relative standard errors); None without two repeats on both sides.
    Exact (no spread on either side) values that differ have p = 0."""
    parts = _welch_parts(a, b)
    if parts is None or a.mean <= 0 or b.mean <= 0:
        return None
    ua, ub, df = parts
    if ua + ub == 0:
        return 1.0 if a.mean == b.mean else 0.0
    t = math.log(a.mean / b.mean) / math.sqrt(ua + ub)
    return t_sf2(t, max(1.0, df))

