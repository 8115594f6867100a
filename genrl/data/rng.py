"""The random streams of a run, in one place.

Everything random derives from a stream key: a stable hash (BLAKE2b, not Python's salted
``hash``) of the run's seed, the iteration, the dynamic-sampling round, the stream's name and,
where a stream has several members, their indices (a sampling step, an epoch, a group, a
process's first sample). So a resumed run draws what an uninterrupted one draws, and a run on N
processes what a one-process run draws for every global stream (the process-local ones, token
sampling and minibatch order, depend on the process's slice), streams never collide by arithmetic accident (the old ``a * p + b``
mixes could), and adding a stream changes no other stream's numbers. ``Streams`` names every
stream the library uses; ``RolloutNoise`` hands out one iteration's streams.
"""

from __future__ import annotations

import hashlib
from typing import Any

import torch

StreamId = str | tuple[str | int, ...]
"""A stream: its name, or its name and member indices, e.g. ``(Streams.STEP_NOISE, 3)``."""


def stream_key(*parts: str | int) -> int:
    """A 63-bit seed from ``parts``: BLAKE2b of their text, the same on every machine and
    Python version."""
    text = "/".join(str(part) for part in parts)
    digest = hashlib.blake2b(text.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def stream_generator(*parts: str | int) -> torch.Generator:
    """A CPU generator seeded with ``stream_key(*parts)``."""
    return torch.Generator().manual_seed(stream_key(*parts))


class Streams:
    """The names of the library's random streams (changing one changes the runs that use it)."""

    PROMPTS = "prompts"
    """The training prompts of an iteration (``PromptSource.sample``)."""
    INITIAL_NOISE = "initial_noise"
    """Initial noise of flow rollouts (per sample, or per group with shared noise)."""
    STEP_NOISE = "step_noise"
    """Sampling step ``i``'s noise: ``(STEP_NOISE, i)``."""
    SDE_WINDOW = "sde_window"
    """Where a random SDE window sits."""
    STEP_SELECTION = "step_selection"
    """Which steps of a trajectory are trained (random selection)."""
    DROP_REFILL = "drop_refill"
    """Zero-advantage trajectories taken back to fill minibatches."""
    MINIBATCH_ORDER = "minibatch_order"
    """Epoch ``e``'s shuffle of training units: ``(MINIBATCH_ORDER, e)``."""
    NOISING_TIME = "noising_time"
    """``t`` of the regression objectives' noisings."""
    NOISING_EPS = "noising_eps"
    """``eps`` of the regression objectives' noisings."""
    TOKEN_SAMPLING = "token_sampling"
    """Token sampling of language-model rollouts."""
    MEMBER_EPS = "member_eps"
    """GDRO's per-member ``eps`` when a group does not share it."""
    MASK_VIEWS = "mask_views"
    """Inner iteration ``j``'s masked-LM views: ``(MASK_VIEWS, j)``."""
    TREE_EDGES = "tree_edges"
    """BranchGRPO's split noise of step ``t`` in tree ``g``: ``(TREE_EDGES, t, g)``."""
    OFFLINE_FILL = "offline_fill"
    """The batches that fill an offline store (apart from training's)."""
    OFFLINE_ORDER = "offline_order"
    """Pass ``e``'s order of an offline store's groups: ``(OFFLINE_ORDER, e)``."""
    REPLAY = "replay"
    """The replay store's draws (ExGRPO's buckets and questions, random trajectory choices)."""


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
        purpose: str = "train",
    ) -> None:
        if layout not in ("global", "local"):
            raise ValueError(f"noise layout must be 'global' or 'local', got {layout!r}")
        self.seed = seed
        self.iteration = iteration
        self.num_global = num_global
        self.local = local
        self.layout = layout
        self.round_index = round_index  # refill round of dynamic sampling (0: the first batch)
        self.purpose = purpose  # "train", or e.g. Streams.OFFLINE_FILL: apart from training

    @property
    def num_local(self) -> int:
        return self.local.stop - self.local.start

    def key(self, stream: StreamId, *members: str | int) -> int:
        """The seed of ``stream`` (and ``members``) in this iteration and round."""
        parts = (stream,) if isinstance(stream, str) else stream
        head = ("genrl", self.purpose, self.seed, self.iteration, self.round_index)
        return stream_key(*head, *parts, *members)

    def generator(self, stream: StreamId) -> torch.Generator:
        """A CPU generator for ``stream``, the same on every process."""
        return torch.Generator().manual_seed(self.key(stream))

    def _local_generator(self, stream: StreamId) -> torch.Generator:
        """A stream of this process's slice: distinct across processes, fixed across resumes."""
        return torch.Generator().manual_seed(self.key(stream, "slice", self.local.start))

    def _per_sample(self, draw: Any, stream: StreamId, shape: tuple[int, ...]) -> torch.Tensor:
        if self.layout == "global":
            return draw((self.num_global, *shape), generator=self.generator(stream))[self.local]
        return draw((self.num_local, *shape), generator=self._local_generator(stream))

    def randn(
        self, stream: StreamId, event_shape: tuple[int, ...], device: torch.device | str = "cpu"
    ) -> torch.Tensor:
        """``[n_local, *event_shape]`` standard-normal noise of ``stream`` on ``device`` (drawn
        on the CPU, so the numbers do not depend on the accelerator)."""
        return self._per_sample(torch.randn, stream, event_shape).to(device)

    def randn_by_sample(
        self, stream: StreamId, event_shape: tuple[int, ...], device: torch.device | str = "cpu"
    ) -> torch.Tensor:
        """``[n_local, *event_shape]`` standard-normal noise, each sample from its own member
        of ``stream`` (keyed by its index in the global batch): the same numbers on any number
        of processes (like ``layout="global"``) at the cost of this process's samples only
        (large per-sample draws, e.g. several noisings of a 512 px latent)."""
        rows = [
            torch.randn(event_shape, generator=torch.Generator().manual_seed(self.key(stream, i)))
            for i in range(self.local.start, self.local.stop)
        ]
        if not rows:
            return torch.zeros((0, *event_shape), device=device)
        return torch.stack(rows).to(device)

    def randn_per_group(
        self,
        stream: StreamId,
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
        table = torch.randn((num_groups, *event_shape), generator=self.generator(stream))
        return table[ids].to(device)

    def rand(self, stream: StreamId, shape: tuple[int, ...]) -> torch.Tensor:
        """``[n_local, *shape]`` uniform numbers of ``stream`` (CPU)."""
        return self._per_sample(torch.rand, stream, shape)

    def device_generator(self, stream: StreamId, device: torch.device | str) -> torch.Generator:
        """A generator on ``device`` for this process's slice, for samplers that draw on the
        accelerator (token sampling): reproducible on resume, but, like ``layout="local"``,
        dependent on the process layout."""
        seed = self.key(stream, "slice", self.local.start)
        return torch.Generator(device).manual_seed(seed)

    def local_permutation(self, stream: StreamId, n: int) -> torch.Tensor:
        """A permutation of this process's ``n`` training units (differs across processes)."""
        return torch.randperm(n, generator=self._local_generator(stream))
