"""Per-peer objectives for the averaging simulator, vectorised over peers.

Peer i minimises f_i(x) = 1/2 ||A_i x - b_i||^2 with its own A_i (m x d, well conditioned)
and b_i = A_i c_i, so its own optimum is c_i = centre + heterogeneity * N(0, I). The swarm
minimises F_S(x) = mean_{i in S} f_i(x) over the live set S, whose optimum

    x*_S = (sum_i H_i)^-1 sum_i H_i c_i,   H_i = A_i^T A_i,

differs from every c_i and from their plain mean: a peer that does not average cannot find
it, and an algorithm that averages with a bias converges to the wrong point.
"""

from __future__ import annotations

import numpy as np


class Quadratics:
    def __init__(self, peers: int, dim: int, seed: int, heterogeneity: float = 1.0,
                 conditioning: float = 0.5) -> None:
        rng = np.random.default_rng([seed, 0xA5])
        m = dim
        self.dim = dim
        self.A = np.eye(dim)[None] + conditioning * rng.normal(size=(peers, m, dim)) / np.sqrt(dim)
        self.centres = 1.0 + heterogeneity * rng.normal(size=(peers, dim))
        self.b = np.einsum("pmd,pd->pm", self.A, self.centres)
        self.H = np.einsum("pmd,pme->pde", self.A, self.A)  # per-peer Hessians
        self.Hc = np.einsum("pde,pe->pd", self.H, self.centres)
        self.c0 = 0.5 * np.einsum("pm,pm->p", self.b, self.b)  # f_i(x) = x'Hx/2 - x'Hc + c0
        self.lipschitz = float(np.linalg.eigvalsh(self.H).max())
        self._optima: dict[tuple[int, ...], tuple[np.ndarray, float]] = {}

    def grad(self, i: int, x: np.ndarray) -> np.ndarray:
        """grad f_i(x) in float64."""
        return self.H[i] @ x - self.Hc[i]

    def loss(self, live: tuple[int, ...], x: np.ndarray) -> float:
        """F_S(x) for the live set S."""
        idx = list(live)
        h, hc, c0 = self.H[idx].mean(0), self.Hc[idx].mean(0), self.c0[idx].mean()
        return float(0.5 * x @ h @ x - x @ hc + c0)

    def optimum(self, live: tuple[int, ...]) -> tuple[np.ndarray, float]:
        """(x*_S, F_S(x*_S)) for the live set S (a sorted tuple of peer indices), memoised."""
        found = self._optima.get(live)
        if found is None:
            idx = list(live)
            x = np.linalg.solve(self.H[idx].sum(0), self.Hc[idx].sum(0))
            found = self._optima[live] = (x, self.loss(live, x))
        return found
