"""The named random streams (genrl/data/rng.py): stable keys, independent names and members, the
same numbers on any process layout."""

from __future__ import annotations

import hashlib

import torch

from genrl.data.rng import RolloutNoise, Streams, stream_generator, stream_key


def test_stream_keys_are_blake2b_of_the_parts() -> None:
    """By hand: the first 8 bytes of BLAKE2b over the parts joined by '/', little-endian, less
    the top bit; pinned, so a change of the scheme shows here (and in the golden curves)."""
    digest = hashlib.blake2b(b"genrl/train/0/0/0/initial_noise", digest_size=8).digest()
    assert stream_key("genrl", "train", 0, 0, 0, "initial_noise") == (
        int.from_bytes(digest, "little") >> 1
    )
    assert stream_key("genrl", "train", 0, 0, 0, "initial_noise") == 222322307199526069
    assert 0 <= stream_key("x") < 2**63


def test_names_members_iterations_rounds_and_purposes_draw_apart() -> None:
    noise = RolloutNoise(seed=3, iteration=5, num_global=4, local=slice(0, 4))
    keys = {
        noise.key(Streams.STEP_NOISE),
        noise.key((Streams.STEP_NOISE, 0)),
        noise.key((Streams.STEP_NOISE, 1)),
        noise.key(Streams.INITIAL_NOISE),
        RolloutNoise(3, 6, 4, slice(0, 4)).key(Streams.STEP_NOISE),
        RolloutNoise(3, 5, 4, slice(0, 4), round_index=1).key(Streams.STEP_NOISE),
        RolloutNoise(3, 5, 4, slice(0, 4), purpose=Streams.OFFLINE_FILL).key(Streams.STEP_NOISE),
        RolloutNoise(4, 5, 4, slice(0, 4)).key(Streams.STEP_NOISE),
    }
    assert len(keys) == 8
    # A stream's numbers depend on nothing else: the same key, the same draw.
    a = noise.randn((Streams.STEP_NOISE, 2), (3,))
    assert torch.equal(a, RolloutNoise(3, 5, 4, slice(0, 4)).randn((Streams.STEP_NOISE, 2), (3,)))
    assert stream_generator("a", 1).initial_seed() == stream_key("a", 1)


def test_global_streams_do_not_depend_on_the_process_layout() -> None:
    whole = RolloutNoise(1, 2, 6, slice(0, 6))
    halves = [RolloutNoise(1, 2, 6, s) for s in (slice(0, 3), slice(3, 6))]
    for draw in (
        lambda n: n.randn(Streams.INITIAL_NOISE, (2,)),
        lambda n: n.rand(Streams.STEP_SELECTION, (4,)),
        lambda n: n.randn_by_sample(Streams.NOISING_EPS, (2, 2)),
    ):
        assert torch.equal(torch.cat([draw(h) for h in halves]), draw(whole))
    # Process-local streams (token sampling, minibatch order) differ between the halves.
    orders = [h.local_permutation((Streams.MINIBATCH_ORDER, 0), 50) for h in halves]
    assert not torch.equal(orders[0], orders[1])
