"""Errors of the flow samplers: bad schedules, out-of-range indices, bad constructor
arguments, a subclass's malformed coefficient table, and batch mismatches; each one clear
exception naming the argument."""

from __future__ import annotations

import math

import pytest
import torch

from samplers import (
    FlowCPSSampler,
    FlowODESampler,
    FlowSDESampler,
    GaussianFlowSampler,
    flow_sigmas,
)
from tests.test_samplers import STOCHASTIC  # the Gaussian samplers, listed once


@pytest.mark.parametrize("cls", [FlowODESampler, *STOCHASTIC])
@pytest.mark.parametrize(
    "sigmas",
    [
        [1.0, 0.5, 0.5, 0.0],  # not strictly decreasing
        [0.0, 0.5, 1.0],  # increasing
        [1.5, 0.5, 0.0],  # above 1
        [1.0, 0.5, -0.1],  # below 0
        [1.0],  # a single level
        [[1.0, 0.0]],  # not 1-D
    ],
)
def test_bad_sigmas_raise(cls, sigmas):
    with pytest.raises(ValueError, match="sigmas"):
        cls(torch.tensor(sigmas))


@pytest.mark.parametrize("cls", [FlowODESampler, *STOCHASTIC])
def test_out_of_range_timestep_index_raises(cls):
    sampler = cls(flow_sigmas(4))
    x = torch.zeros(2, 3)
    for bad in (4, -1, torch.tensor([0, 4]), torch.tensor([-1, 2])):
        with pytest.raises(IndexError, match="timestep_index"):
            sampler.step(x, bad, x)


@pytest.mark.parametrize("cls", STOCHASTIC)
def test_sde_constructor_errors(cls):
    with pytest.raises(ValueError, match="log_prob_reduction"):
        cls(flow_sigmas(4), log_prob_reduction="max")
    for bad in (-0.1, math.nan):
        with pytest.raises(ValueError, match="noise_level"):
            cls(flow_sigmas(4), noise_level=bad)


def test_cps_noise_level_above_one_raises():
    with pytest.raises(ValueError, match=r"noise_level must be in \[0, 1\]"):
        FlowCPSSampler(flow_sigmas(4), noise_level=1.01)
    FlowCPSSampler(flow_sigmas(4), noise_level=1.0)  # the edge itself is fine


def test_gaussian_sampler_checks_the_subclass_table():
    class WrongShape(GaussianFlowSampler):
        def _coefficient_table(self, sigma, sigma_next):
            return torch.zeros(2, sigma.numel())

    class NegativeStd(GaussianFlowSampler):
        def _coefficient_table(self, sigma, sigma_next):
            ones = torch.ones_like(sigma)
            return torch.stack([ones, sigma_next - sigma, -ones])

    with pytest.raises(TypeError, match=r"\[3, 4\]"):
        WrongShape(flow_sigmas(4), 0.5)
    with pytest.raises(ValueError, match="negative std"):
        NegativeStd(flow_sigmas(4), 0.5)


def test_step_output_std_does_not_alias_the_coefficient_table():
    sde = FlowSDESampler(flow_sigmas(4))
    x = torch.zeros(1, 2)
    sde.step(x, 1, x).std.zero_()  # a caller editing the output in place
    assert sde.step(x, 1, x).std.item() > 0


def test_per_sample_index_batch_mismatch_raises():
    sde = FlowSDESampler(flow_sigmas(4))
    x = torch.zeros(3, 2)
    with pytest.raises(ValueError, match="batch"):
        sde.step(x, torch.tensor([0, 1]), x)
