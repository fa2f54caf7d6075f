"""Student's t and chi-square quantiles, integrated here: no statistics library needed, and
the same numbers in the engine and in the benches that judge it."""

from __future__ import annotations

import math
from collections.abc import Callable


def _t_cdf(x: float, nu: float) -> float:
    """Student's t CDF (Simpson's rule on the density: exact enough for quantiles)."""
    if x == 0:
        return 0.5
    log_c = math.lgamma((nu + 1) / 2) - math.lgamma(nu / 2) - 0.5 * math.log(nu * math.pi)
    steps = 400  # Simpson: the density is smooth, its error is far below what a quantile needs
    h = abs(x) / steps
    total = 0.0
    for i in range(steps + 1):
        u = i * h
        w = 1 if i in (0, steps) else (4 if i % 2 else 2)
        total += w * math.exp(log_c - (nu + 1) / 2 * math.log1p(u * u / nu))
    area = total * h / 3
    return 0.5 + area if x > 0 else 0.5 - area


def t_quantile(p: float, nu: float) -> float:
    """The ``p`` quantile of Student's t with ``nu`` degrees of freedom."""
    if not 0 < p < 1 or nu <= 0:
        raise ValueError("need 0 < p < 1 and nu > 0")
    if p < 0.5:
        return -t_quantile(1 - p, nu)
    return _invert(lambda x: _t_cdf(x, nu), p, 1.0)


def _invert(cdf: Callable[[float], float], p: float, hi: float) -> float:
    """The x ≥ 0 where an increasing ``cdf`` reaches ``p``, by bisection."""
    lo = 0.0
    while cdf(hi) < p:
        hi *= 2
    for _ in range(80):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if cdf(mid) < p else (lo, mid)
    return (lo + hi) / 2


def _chi2_cdf(x: float, k: float) -> float:
    """The chi-square CDF: the regularized lower incomplete gamma P(k/2, x/2), by its series."""
    if x <= 0:
        return 0.0
    s, z = k / 2, x / 2
    term = 1.0 / s
    total = term
    n = 1
    while term > total * 1e-15 and n < 10_000:
        term *= z / (s + n)
        total += term
        n += 1
    return math.exp(s * math.log(z) - z - math.lgamma(s)) * total


def chi2_quantile(p: float, k: float) -> float:
    if not 0 < p < 1 or k <= 0:
        raise ValueError("need 0 < p < 1 and k > 0")
    return _invert(lambda x: _chi2_cdf(x, k), p, max(1.0, k))
