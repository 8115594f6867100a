"""The min-norm quadratic program of MARBLE / MGDA (``genrl/objectives/gradient_balancing.py``)
on gradients whose solutions are known by hand."""

from __future__ import annotations

import pytest
import torch

from genrl.objectives.gradient_balancing import (
    cosines_with,
    flat_gradient_gram,
    min_norm_weights,
    normalised_gram,
    project_to_simplex,
    two_point_min_norm,
)


def _gram(*vectors: list[float]) -> torch.Tensor:
    g = torch.tensor(vectors, dtype=torch.float64)
    return g @ g.T


def test_two_orthogonal_gradients_take_half_each() -> None:
    # ||a (1, 0) + (1 - a) (0, 2)||^2 = a^2 + 4 (1 - a)^2 is least at a = 4/5 on raw
    # gradients; normalised, the two unit vectors are symmetric: 1/2 each.
    raw = _gram([1.0, 0.0], [0.0, 2.0])
    assert min_norm_weights(raw).tolist() == pytest.approx([0.8, 0.2])
    unit, norms = normalised_gram(raw)
    assert norms.tolist() == pytest.approx([1.0, 2.0])
    assert min_norm_weights(unit).tolist() == pytest.approx([0.5, 0.5])


def test_opposite_gradients_cancel_at_one_half() -> None:
    gram = _gram([1.0, -2.0], [-1.0, 2.0])
    weights = min_norm_weights(gram)
    assert weights.tolist() == pytest.approx([0.5, 0.5])
    assert float(weights @ gram @ weights) == pytest.approx(0.0)


def test_a_dominated_gradient_gets_all_the_weight() -> None:
    # b = (2, 0) and a = (1, 0): the hull's nearest point to 0 is a itself.
    assert two_point_min_norm(1.0, 2.0, 4.0) == 1.0
    assert min_norm_weights(_gram([1.0, 0.0], [2.0, 0.0])).tolist() == pytest.approx([1.0, 0.0])


@pytest.mark.parametrize("solver", ["frank_wolfe", "projected_gradient"])
def test_three_gradients_with_a_known_min_norm_point(solver: str) -> None:
    # Hull of (1, 0), (0, 1), (1, 1): its nearest point to 0 is (1/2, 1/2), on the first edge.
    gram = _gram([1.0, 0.0], [0.0, 1.0], [1.0, 1.0])
    weights = min_norm_weights(gram, solver=solver, max_iters=2000)  # type: ignore[arg-type]
    assert weights.tolist() == pytest.approx([0.5, 0.5, 0.0], abs=1e-5)
    # Three orthonormal gradients: the centroid, 1/3 each, norm^2 1/3.
    gram = torch.eye(3, dtype=torch.float64)
    weights = min_norm_weights(gram, solver=solver, max_iters=2000)  # type: ignore[arg-type]
    assert weights.tolist() == pytest.approx([1 / 3] * 3, abs=1e-5)


@pytest.mark.parametrize("solver", ["frank_wolfe", "projected_gradient"])
def test_the_interior_solution_of_three_gradients(solver: str) -> None:
    # (1, 0, 0), (0, 2, 0) and (0, 0, 1): the min-norm point of orthogonal vectors with norms
    # n_k has alpha_k proportional to 1 / n_k^2, here (1, 1/4, 1) / (9/4) = (4, 1, 4) / 9.
    gram = torch.diag(torch.tensor([1.0, 4.0, 1.0], dtype=torch.float64))
    weights = min_norm_weights(gram, solver=solver, max_iters=5000)  # type: ignore[arg-type]
    assert weights.tolist() == pytest.approx([4 / 9, 1 / 9, 4 / 9], abs=1e-4)


def test_the_min_norm_direction_is_aligned_with_every_gradient() -> None:
    torch.manual_seed(0)
    g = torch.randn(4, 50, dtype=torch.float64)
    g[1] = -0.9 * g[0] + 0.1 * torch.randn(50, dtype=torch.float64)  # a strong conflict
    gram = g @ g.T
    unit, _ = normalised_gram(gram)
    weights = min_norm_weights(unit)
    d_d = float(weights @ unit @ weights)
    # The optimality condition: <g_k, d*> >= ||d*||^2 for every k.
    assert (unit @ weights >= d_d - 1e-8).all()
    cosines = cosines_with(unit, weights)
    assert (cosines >= -1e-8).all()
    # The plain sum is anti-aligned with one of the two conflicting rewards.
    assert float(cosines_with(gram, torch.ones(4, dtype=torch.float64)).min()) < 0


def test_cosines_and_gram_by_hand() -> None:
    gram = _gram([1.0, 0.0], [0.0, 1.0])
    # d = (1, 1): 45 degrees from either.
    assert cosines_with(gram, torch.tensor([1.0, 1.0])).tolist() == pytest.approx(
        [2**-0.5, 2**-0.5]
    )
    grads = [[torch.tensor([1.0, 0.0]), torch.tensor([[2.0]])], [torch.tensor([0.0, 3.0]), None]]
    assert flat_gradient_gram(grads).tolist() == [[5.0, 0.0], [0.0, 9.0]]


def test_projection_onto_the_simplex_by_hand() -> None:
    assert project_to_simplex(torch.tensor([0.5, 0.5])).tolist() == [0.5, 0.5]
    assert project_to_simplex(torch.tensor([2.0, 0.0])).tolist() == [1.0, 0.0]
    # (0.6, 0.6, -1): shift by 0.1 on the first two -> (0.5, 0.5, 0).
    assert project_to_simplex(torch.tensor([0.6, 0.6, -1.0])).tolist() == pytest.approx(
        [0.5, 0.5, 0.0]
    )
