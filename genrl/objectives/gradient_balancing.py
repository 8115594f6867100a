"""Gradient balancing for several rewards: the min-norm point of the convex hull of per-reward
gradients (MGDA's quadratic program; Desideri 2012, Sener & Koltun 2018, arXiv 1810.04650),
as MARBLE solves it on normalised per-reward policy gradients (Zhao et al. 2026,
arXiv 2605.06507).

Everything here works on the Gram matrix ``G_kl = <g_k, g_l>`` of ``K`` gradients, so the
gradients themselves (millions of entries) are reduced once to a ``K x K`` matrix and the
program is solved in ``K`` dimensions:

    min_alpha  || sum_k alpha_k g_k ||^2 = alpha^T G alpha,   alpha_k >= 0,  sum_k alpha_k = 1.

Its minimiser ``d* = sum_k alpha*_k g_k`` satisfies ``<g_k, d*> >= ||d*||^2`` for every ``k``
(the optimality condition of the program over the simplex), so the combined direction has a
non-negative inner product with every reward's gradient: none is made worse to first order.

Solvers: the closed form for two gradients; for more, Frank-Wolfe with the exact line search
(Sener & Koltun, Algorithm 2), started from the best pair, or projected gradient descent onto
the simplex (Duchi et al. 2008's projection) as an alternative.
"""

from __future__ import annotations

from typing import Literal

import torch

Solver = Literal["frank_wolfe", "projected_gradient"]


def two_point_min_norm(aa: float, ab: float, bb: float) -> float:
    """``gamma`` minimising ``||gamma a + (1 - gamma) b||^2`` over ``[0, 1]``, from the inner
    products ``<a, a>``, ``<a, b>``, ``<b, b>`` (Sener & Koltun, Algorithm 1):
    ``gamma = <b - a, b> / ||a - b||^2``, clipped. Equal points give 1/2."""
    denominator = aa - 2 * ab + bb
    if denominator <= 1e-20:
        return 0.5
    return min(max((bb - ab) / denominator, 0.0), 1.0)


def project_to_simplex(v: torch.Tensor) -> torch.Tensor:
    """Euclidean projection onto ``{x >= 0, sum x = 1}`` (Duchi et al. 2008, Figure 1): sort,
    find the largest ``rho`` with ``u_rho - (cumsum_rho - 1) / rho > 0``, shift and clip."""
    u, _ = torch.sort(v, descending=True)
    cumulative = torch.cumsum(u, 0) - 1
    index = torch.arange(1, len(v) + 1, dtype=v.dtype, device=v.device)
    rho = int((u - cumulative / index > 0).nonzero().max())
    theta = cumulative[rho] / (rho + 1)
    return (v - theta).clamp(min=0)


def min_norm_weights(
    gram: torch.Tensor,
    solver: Solver = "frank_wolfe",
    max_iters: int = 250,
    tol: float = 1e-10,
) -> torch.Tensor:
    """The weights ``alpha`` on the simplex that minimise ``alpha^T G alpha``.

    Args:
        gram: ``[K, K]`` Gram matrix of the gradients (symmetric positive semi-definite).
        solver: for ``K > 2``: ``frank_wolfe`` (exact line search each step) or
            ``projected_gradient`` (step ``1 / (2 ||G||_2)``); ``K <= 2`` is solved in closed
            form either way.
        max_iters: iterations of the solver.
        tol: stop when the Frank-Wolfe duality gap (or the projected step) is below this.

    Returns:
        ``[K]`` float64 weights, non-negative, summing to 1.
    """
    g = gram.detach().double().cpu()
    k = g.shape[0]
    if k == 1:
        return torch.ones(1, dtype=torch.float64)
    if k == 2:
        gamma = two_point_min_norm(float(g[0, 0]), float(g[0, 1]), float(g[1, 1]))
        return torch.tensor([gamma, 1 - gamma], dtype=torch.float64)
    if solver == "frank_wolfe":
        return _frank_wolfe(g, max_iters, tol)
    if solver == "projected_gradient":
        return _projected_gradient(g, max_iters, tol)
    raise ValueError(f"solver must be frank_wolfe or projected_gradient, got {solver!r}")


def _best_pair(g: torch.Tensor) -> torch.Tensor:
    """The start of Frank-Wolfe: the best two-gradient solution over all pairs (Sener & Koltun
    start from it too), which is already optimal when the min-norm point lies on an edge."""
    k = g.shape[0]
    best, best_value = None, float("inf")
    for i in range(k):
        for j in range(i + 1, k):
            gamma = two_point_min_norm(float(g[i, i]), float(g[i, j]), float(g[j, j]))
            value = (
                gamma * gamma * g[i, i]
                + 2 * gamma * (1 - gamma) * g[i, j]
                + (1 - gamma) ** 2 * g[j, j]
            )
            if float(value) < best_value:
                best_value = float(value)
                best = torch.zeros(k, dtype=torch.float64)
                best[i], best[j] = gamma, 1 - gamma
    assert best is not None
    return best


def _frank_wolfe(g: torch.Tensor, max_iters: int, tol: float) -> torch.Tensor:
    alpha = _best_pair(g)
    for _ in range(max_iters):
        grad = g @ alpha  # half the gradient of alpha^T G alpha: <g_k, d>
        t = int(torch.argmin(grad))
        d_d = float(alpha @ grad)  # ||d||^2
        gap = d_d - float(grad[t])  # Frank-Wolfe duality gap (halved)
        if gap <= tol:
            break
        # Exact line search between the current point d and the vertex g_t.
        gamma = two_point_min_norm(float(g[t, t]), float(grad[t]), d_d)
        alpha = (1 - gamma) * alpha
        alpha[t] += gamma
    return alpha


def _projected_gradient(g: torch.Tensor, max_iters: int, tol: float) -> torch.Tensor:
    alpha = torch.full((g.shape[0],), 1.0 / g.shape[0], dtype=torch.float64)
    lipschitz = 2 * float(torch.linalg.matrix_norm(g, ord=2))
    if lipschitz <= 0:
        return alpha
    for _ in range(max_iters):
        updated = project_to_simplex(alpha - 2 * (g @ alpha) / lipschitz)
        step = float((updated - alpha).abs().max())
        alpha = updated
        if step <= tol:
            break
    return alpha


def normalised_gram(gram: torch.Tensor, eps: float = 1e-12) -> tuple[torch.Tensor, torch.Tensor]:
    """``(G_kl / (|g_k| |g_l|), |g_k|)``: the Gram matrix of the unit gradients and the norms.
    A zero gradient stays a zero row (it carries no direction)."""
    g = gram.detach().double()
    norms = g.diagonal().clamp(min=0).sqrt()
    inverse = torch.where(norms > eps, 1 / norms.clamp(min=eps), torch.zeros_like(norms))
    return g * inverse[:, None] * inverse[None, :], norms


def cosines_with(gram: torch.Tensor, weights: torch.Tensor, eps: float = 1e-20) -> torch.Tensor:
    """``cos(g_k, d)`` for every ``k``, ``d = sum_l w_l g_l``, from the Gram matrix alone:
    ``(G w)_k / (sqrt(G_kk) sqrt(w^T G w))``; 0 where either vector vanishes."""
    g = gram.detach().double()
    w = weights.detach().double().to(g.device)
    inner = g @ w
    scale = (g.diagonal().clamp(min=0) * (w @ inner).clamp(min=0)).sqrt()
    return torch.where(scale > eps, inner / scale.clamp(min=eps), torch.zeros_like(inner))


def flat_gradient_gram(gradients: list[list[torch.Tensor | None]]) -> torch.Tensor:
    """``[K, K]`` Gram matrix of ``K`` gradients, each a list of per-parameter tensors (None for
    a parameter the loss does not reach), summed parameter by parameter so no flattened copy
    of the model's gradient is made."""
    k = len(gradients)
    gram = torch.zeros(k, k, dtype=torch.float64)
    for p in range(len(gradients[0])):
        parts = [grads[p] for grads in gradients]
        present = [part for part in parts if part is not None]
        if not present:
            continue
        zeros = torch.zeros_like(present[0])
        rows = torch.stack(
            [(zeros if part is None else part).double().reshape(-1) for part in parts]
        )
        gram += (rows @ rows.T).cpu()
    return gram


__all__ = [
    "cosines_with",
    "flat_gradient_gram",
    "min_norm_weights",
    "normalised_gram",
    "project_to_simplex",
    "two_point_min_norm",
]
