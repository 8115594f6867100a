"""The random streams of a run, in one place.

Everything random in an iteration derives from ``(seed, iteration, round)`` and a stream tag, so
a resumed run and a run on N processes draw what an uninterrupted one-process run draws.
``RolloutNoise`` hands out the streams; ``Streams`` names every tag the library uses (each tag
stays a fixed integer, so the numbers of a run never change with the code's layout).
"""

from __future__ import annotations

from typing import Any

import torch


class Streams:
    """The stream tags of ``RolloutNoise`` (integers; keep them fixed, runs depend on them)."""

    INITIAL_NOISE = 0
    """Initial noise of flow rollouts (per sample, or per group with shared noise)."""
    STEP_NOISE = 1
    """Step ``i``'s noise is stream ``STEP_NOISE + i``."""
    SDE_WINDOW = 9_000
    """Where a random SDE window sits."""
    STEP_SELECTION = 10_000
    """Which steps of a trajectory are trained (random selection)."""
    DROP_REFILL = 10_500
    """Zero-advantage trajectories taken back to fill minibatches."""
    MINIBATCH_ORDER = 20_000
    """Epoch ``e``'s shuffle of training units is stream ``MINIBATCH_ORDER + e``."""
    NOISING_TIME = 30_000
    """``t`` of the regression objectives' noisings."""
    NOISING_EPS = 31_000
    """``eps`` of the regression objectives' noisings."""
    TOKEN_SAMPLING = 31_337
    """Token sampling of language-model rollouts."""
    MEMBER_EPS = 32_000
    """GDRO's per-member ``eps`` when a group does not share it."""
    MASK_VIEWS = 40_000
    """Inner iteration ``j``'s masked-LM views are seeded from stream ``MASK_VIEWS + j``."""
    TREE_EDGES = 50_000
    """BranchGRPO's split noise: ``TREE_EDGES + step * 100_003 + 7 * group``."""
    OFFLINE_FILL_SEED = 900_001
    """Offset of the seed that fills an offline store (its batches draw apart from training)."""


class RolloutNoise:
    """The random streams of one iteration, reproducible from ``(seed, iteration)``.

    With ``layout="global"`` (default) per-sample randomness is drawn for the *global* batch and
    each process keeps its slice, so a sample gets the same noise on 1 or N processes and after a
    resume. That costs each process a draw for the whole batch; ``layout="local"`` draws only the
    process's own samples from a stream that also depends on its slice (cheaper for very large
    batches, still exact on resume, but not identical across process counts).
    """

    def __init__(
        self,
        seed: int,
        iteration: int,
        num_global: int,
        local: slice,
        layout: str = "global",
        round_index: int = 0,
    ) -> None:
        if layout not in ("global", "local"):
            raise ValueError(f"noise layout must be 'global' or 'local', got {layout!r}")
        self.seed = seed
        self.iteration = iteration
        self.num_global = num_global
        self.local = local
        self.layout = layout
        self.round_index = (
            round_index  # refill round of dynamic sampling (0: the iteration's first batch)
        )

    @property
    def num_local(self) -> int:
        return self.local.stop - self.local.start

    def generator(self, tag: int) -> torch.Generator:
        """A CPU generator for stream ``tag``, the same on every process."""
        # Large odd multipliers keep neighbouring iterations and tags from colliding.
        key = self.seed * 1_000_003 + self.iteration * 7_919 + tag * 104_729
        return torch.Generator().manual_seed((key + self.round_index * 15_485_867) % (2**63 - 1))

    def _per_sample(self, draw: Any, tag: int, shape: tuple[int, ...]) -> torch.Tensor:
        if self.layout == "global":
            return draw((self.num_global, *shape), generator=self.generator(tag))[self.local]
        # A stream per (tag, slice start): distinct across processes, fixed across resumes.
        return draw(
            (self.num_local, *shape), generator=self.generator(tag * 65_537 + self.local.start)
        )

    def randn(
        self, tag: int, event_shape: tuple[int, ...], device: torch.device | str = "cpu"
    ) -> torch.Tensor:
        """``[n_local, *event_shape]`` standard-normal noise for stream ``tag`` on ``device``
        (drawn on the CPU, so the numbers do not depend on the accelerator)."""
        return self._per_sample(torch.randn, tag, event_shape).to(device)

    def randn_by_sample(
        self, tag: int, event_shape: tuple[int, ...], device: torch.device | str = "cpu"
    ) -> torch.Tensor:
        """``[n_local, *event_shape]`` standard-normal noise, each sample from its own stream
        seeded from stream ``tag`` of the global batch: the same numbers on any number of
        processes (like ``layout="global"``) at the cost of this process's samples only (large
        per-sample draws, e.g. several noisings of a 512 px latent)."""
        seeds = torch.randint(2**62, (self.num_global,), generator=self.generator(tag))
        rows = [
            torch.randn(event_shape, generator=torch.Generator().manual_seed(int(seed)))
            for seed in seeds[self.local].tolist()
        ]
        if not rows:
            return torch.zeros((0, *event_shape), device=device)
        return torch.stack(rows).to(device)

    def randn_per_group(
        self,
        tag: int,
        event_shape: tuple[int, ...],
        group_ids: torch.Tensor,
        num_groups: int,
        device: torch.device | str = "cpu",
    ) -> torch.Tensor:
        """Standard-normal noise shared by the samples of a group: ``[len(group_ids), *event]``
        where row ``i`` is the draw of group ``group_ids[i]`` (ids in ``[0, num_groups)``).
        Drawn for all groups, so it does not depend on how groups are split over processes."""
        ids = group_ids.cpu()
        if len(ids) and (int(ids.min()) < 0 or int(ids.max()) >= num_groups):
            raise ValueError(f"group ids must lie in [0, {num_groups}), got {ids.tolist()}")
        table = torch.randn((num_groups, *event_shape), generator=self.generator(tag))
        return table[ids].to(device)

    def rand(self, tag: int, shape: tuple[int, ...]) -> torch.Tensor:
        """``[n_local, *shape]`` uniform numbers for stream ``tag`` (CPU)."""
        return self._per_sample(torch.rand, tag, shape)

    def device_generator(self, tag: int, device: torch.device | str) -> torch.Generator:
        """A generator on ``device`` for this process's slice, for samplers that draw on the
        accelerator (token sampling): reproducible on resume, but, like ``layout="local"``,
        dependent on the process layout."""
        seed = torch.randint(2**62, (1,), generator=self.generator(tag * 65_537 + self.local.start))
        return torch.Generator(device).manual_seed(int(seed))

    def local_permutation(self, tag: int, n: int) -> torch.Tensor:
        """A permutation of this process's ``n`` training units (differs across processes)."""
        return torch.randperm(n, generator=self.generator(tag * 65_537 + self.local.start))
