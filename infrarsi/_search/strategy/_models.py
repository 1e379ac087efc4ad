"""The search's models: step time (Bayesian ridge), peak memory (censored), failures.

Both regressions work on the logarithm (effects of optimizations multiply) over
:meth:`Space.encode` features: one column per atom plus every pairwise product,
the interactions scaled down so the prior expects them smaller than main effects.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from scipy import optimize, stats

from infrarsi._search.strategy._space import Atom, Point, Space

__all__ = ["SpeedModel", "MemoryModel", "Failures", "expected_improvement"]

INTERACTION_SCALE = 0.5  # prior std of an interaction, relative to a main effect
PRIOR_LOG_STD = 0.3  # before any data: a change may move the step time by ~30%
SIGMA_FLOOR = 0.02  # peak memory's run-to-run noise is never taken as under 2%, however well a fit goes
# Each out-of-memory run containing an atom that has never fitted multiplies the chance that a
# point with that atom fits by this (see MemoryModel.p_fit).
UNESCAPED_OOM_FACTOR = 0.5


def _features(space: Space, points: list[Point]) -> np.ndarray:
    x = space.encode(points)
    x[:, space.n_main :] *= INTERACTION_SCALE
    return x


class SpeedModel:
    """log(step time) ~ atoms + pairwise interactions, with a predictive standard deviation."""

    def __init__(self, space: Space) -> None:
        self.space = space
        self._model = None
        self._mean = 0.0
        self._points: list[Point] = []

    def fit(self, points: list[Point], step_times: list[float], weights: list[float] | None = None) -> "SpeedModel":
        """``weights`` down-weight pseudo-runs (a pack's priors); our own runs weigh 1."""
        from sklearn.linear_model import BayesianRidge

        self._points = list(points)
        y = np.log(np.asarray(step_times, dtype=float))
        self._mean = float(np.mean(y)) if len(y) else 0.0
        self._model = None
        if len(points) >= 2:
            model = BayesianRidge(
                fit_intercept=True,
                max_iter=500,
                tol=1e-6,
                alpha_init=1.0 / max(np.var(y), 1e-4),
                lambda_init=1.0 / PRIOR_LOG_STD**2,
            )
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                model.fit(
                    _features(self.space, points),
                    y,
                    sample_weight=None if weights is None else np.asarray(weights, dtype=float),
                )
            self._model = model
        return self

    def predict(self, points: list[Point]) -> tuple[np.ndarray, np.ndarray]:
        """Mean and standard deviation of log(step time) at each point."""
        if not points:
            return np.zeros(0), np.zeros(0)
        if self._model is None:
            known = {p for p in self._points}
            mean = np.full(len(points), self._mean)
            std = np.array([0.02 if p in known else PRIOR_LOG_STD for p in points])
            return mean, std
        mean, std = self._model.predict(_features(self.space, points), return_std=True)
        return mean, np.maximum(std, 1e-3)


def expected_improvement(mean: np.ndarray, std: np.ndarray, best: float) -> np.ndarray:
    """Expected improvement of a minimisation below ``best`` (all in log step time)."""
    z = (best - mean) / std
    return (best - mean) * stats.norm.cdf(z) + std * stats.norm.pdf(z)


@dataclass
class MemoryModel:
    """log(peak memory) ~ atoms + interactions, fitted with OOMs as right-censored data.

    A run that fits gives its peak; a run killed at the limit says only that its peak
    is above ``limit_mb``. The likelihood (Tobit) counts the first through the normal
    density and the second through the survival function, so OOM-only evidence still
    moves the fit; dropping OOMs would teach the model that every change fits.

    An atom seen only in runs out of memory has only lower bounds on its effect, and the
    fit puts it at the lowest: just enough to push those runs over the limit. A new point
    with it and a little less of something else is then predicted right at the limit,
    p_fit about 0.5, however many times that atom has run out of memory (the demo's
    search once spent 10 of 17 runs, 27 s each, on `compile=1` combinations so predicted).
    So each OOM run is also blamed on its atoms that never fitted, shared equally among
    them (as `Failures` shares a crash among its suspects), and `p_fit` multiplies a
    point's chance by `UNESCAPED_OOM_FACTOR` per whole run of blame its atoms carry; the
    first run in which an atom fits clears its share.
    """

    space: Space
    limit_mb: float
    ridge: float = 1.0
    coef_: np.ndarray | None = None
    intercept_: float = 0.0
    sigma_: float = 0.1
    _precision: np.ndarray | None = None
    unescaped_: dict[Atom, float] = field(default_factory=dict)  # atom -> its share of OOMs, never having fitted

    def fit(self, points: list[Point], peaks_mb: list[float | None], censored: list[bool]) -> "MemoryModel":
        """``peaks_mb[i]`` is the measured peak, or ignored when ``censored[i]`` (an OOM)."""
        fitted = set().union(*(self.space.atoms_of(p) for p, c in zip(points, censored) if not c))
        self.unescaped_ = {}
        for point in (p for p, c in zip(points, censored) if c):
            suspects = self.space.atoms_of(point) - fitted
            for atom in suspects:
                self.unescaped_[atom] = self.unescaped_.get(atom, 0.0) + 1.0 / len(suspects)
        x = _features(self.space, points)
        n, d = x.shape
        cens = np.asarray(censored, dtype=bool)
        y = np.array([math.log(self.limit_mb) if c else math.log(max(v, 1e-6)) for v, c in zip(peaks_mb, censored)])
        seen = y[~cens]
        start_b = float(np.mean(seen)) if len(seen) else math.log(self.limit_mb) - 0.2
        theta0 = np.concatenate([[start_b, math.log(0.1)], np.zeros(d)])

        def loss(theta):
            b, log_s, w = theta[0], theta[1], theta[2:]
            s = math.exp(log_s)
            mu = b + x @ w
            z = (y - mu) / s
            nll, grad_mu, grad_s = 0.0, np.zeros(n), 0.0
            if (~cens).any():
                zo = z[~cens]
                nll += float(np.sum(0.5 * zo**2 + log_s))
                grad_mu[~cens] = -zo / s
                grad_s += float(np.sum(1.0 - zo**2))
            if cens.any():
                zc = z[cens]
                logsf = stats.norm.logsf(zc)
                nll -= float(np.sum(logsf))
                ratio = np.exp(stats.norm.logpdf(zc) - logsf)  # inverse Mills ratio
                grad_mu[cens] = -ratio / s
                grad_s += float(np.sum(-ratio * zc))
            # Ridge on the effects, and a weak prior keeping sigma near a few percent.
            nll += 0.5 * self.ridge * float(w @ w) + 0.5 * ((log_s - math.log(0.05)) / 1.0) ** 2
            grad = np.concatenate([[grad_mu.sum(), grad_s + (log_s - math.log(0.05))], x.T @ grad_mu + self.ridge * w])
            return nll, grad

        result = optimize.minimize(
            loss,
            theta0,
            jac=True,
            method="L-BFGS-B",
            bounds=[(None, None), (math.log(SIGMA_FLOOR), math.log(2.0))] + [(None, None)] * d,
        )
        theta = result.x
        self.intercept_, self.sigma_, self.coef_ = float(theta[0]), math.exp(theta[1]), theta[2:]
        # Gaussian approximation of the posterior over (intercept, effects). An OOM counts with
        # a measurement's weight: its true posterior is one-sided (above the limit), which the
        # Tobit curvature would turn into a wide two-sided spread, wrongly putting half of it
        # under the limit; weight 1 keeps the spread narrow on the side the evidence is on.
        weights = np.ones(n)
        xa = np.hstack([np.ones((n, 1)), x])
        prior = np.full(d + 1, self.ridge)
        prior[0] = 1e-4
        self._precision = (xa.T * weights) @ xa / self.sigma_**2 + np.diag(prior)
        return self

    def predict(self, points: list[Point]) -> tuple[np.ndarray, np.ndarray]:
        """Mean and standard deviation of log(peak memory)."""
        x = _features(self.space, points)
        if self.coef_ is None:
            return np.full(len(points), math.log(self.limit_mb) - 0.3), np.full(len(points), 0.3)
        mean = self.intercept_ + x @ self.coef_
        xa = np.hstack([np.ones((len(points), 1)), x])
        cov = np.linalg.inv(self._precision)
        param_var = ((xa @ cov) * xa).sum(axis=1)
        return mean, np.sqrt(self.sigma_**2 + param_var)

    def predict_mb(self, points: list[Point]) -> np.ndarray:
        return np.exp(self.predict(points)[0])

    def p_fit(self, points: list[Point]) -> np.ndarray:
        """Probability that each point's peak stays under the limit: the fit's, times
        `UNESCAPED_OOM_FACTOR` per OOM run of blame its atoms that never fitted carry."""
        mean, std = self.predict(points)
        p = stats.norm.cdf((math.log(self.limit_mb) - mean) / std)
        if self.unescaped_:
            runs = [sum(self.unescaped_.get(a, 0.0) for a in self.space.atoms_of(q)) for q in points]
            p = p * UNESCAPED_OOM_FACTOR ** np.asarray(runs, dtype=float)
        return p


@dataclass
class Failures:
    """What crashed or was rejected, and the smallest change sets that explain it.

    A failed point's atoms contain the culprit. The suspects are its single atoms and
    pairs that no successful run contains, each taken as equally likely to be it; one
    suspect left is a learned incompatibility. A point containing a whole failed set,
    or a learned incompatibility, is not tried again; one containing some suspects is
    tried less (its chance of running is the share of suspects it avoids).
    """

    failed: list[tuple[frozenset[Atom], str]] = field(default_factory=list)
    succeeded: list[frozenset[Atom]] = field(default_factory=list)

    def add_failure(self, atoms: frozenset[Atom], why: str) -> None:
        self.failed.append((atoms, why))

    def add_success(self, atoms: frozenset[Atom]) -> None:
        self.succeeded.append(atoms)

    def _cleared(self, subset: frozenset[Atom]) -> bool:
        return any(subset <= ok for ok in self.succeeded)

    def suspects(self, atoms: frozenset[Atom]) -> list[frozenset[Atom]]:
        """The single atoms and pairs of a failed set that no successful run contains."""
        ordered = sorted(atoms)
        subsets = [frozenset([a]) for a in ordered]
        subsets += [frozenset((a, b)) for i, a in enumerate(ordered) for b in ordered[i + 1 :]]
        return [s for s in subsets if not self._cleared(s)]

    def incompatibilities(self) -> list[dict]:
        """The learned culprits: sets every run containing them failed, with the reason seen."""
        out, seen = [], set()
        for atoms, why in self.failed:
            if self._cleared(atoms):  # the same changes also ran fine: a flake, not an incompatibility
                continue
            suspects = self.suspects(atoms)
            culprit = suspects[0] if len(suspects) == 1 else atoms
            if culprit not in seen:
                seen.add(culprit)
                out.append({"atoms": sorted(culprit), "learned": len(suspects) == 1, "why": why})
        return out

    def p_ok(self, atoms: frozenset[Atom]) -> float:
        """Chance a point with these atoms does not fail like a seen failure did."""
        return self.judge()(atoms)

    def judge(self) -> Callable[[frozenset[Atom]], float]:
        """:meth:`p_ok` with the suspects worked out once, for scoring many points."""
        known = [(failed, self.suspects(failed)) for failed, _ in self.failed if not self._cleared(failed)]

        def p_ok(atoms: frozenset[Atom]) -> float:
            p = 1.0
            for failed, suspects in known:
                if failed <= atoms:
                    return 0.0
                if suspects:
                    p *= 1.0 - sum(1 for s in suspects if s <= atoms) / len(suspects)
            return p

        return p_ok
