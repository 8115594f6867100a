"""``train.overlap_rewards``: chunks scored while the next ones sample give the serial path's
batch, scores and advantages bit for bit; errors, interruptions and stateful rewards behave as
in the serial path."""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch
from tiny import tiny_config

from genrl.loop.collection import CollectedBatch
from genrl.loop.reward_overlap import RewardWorker, sample_and_score
from genrl.loop.trainer import Trainer
from genrl.rollouts.base import Chunk
from reward_models import REWARDS, CompositeReward, RewardError, RewardModel, RewardOutput

torch.set_num_threads(1)


def reward_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("genrl-reward")]


def assert_same_batches(serial: CollectedBatch, overlapped: CollectedBatch) -> None:
    assert serial.scores.keys() == overlapped.scores.keys()
    for name, value in serial.scores.items():
        assert torch.equal(value, overlapped.scores[name]), name
    assert torch.equal(serial.advantages, overlapped.advantages)
    assert torch.equal(serial.group_ids, overlapped.group_ids)
    for f in dataclasses.fields(serial.rollout):
        a, b = getattr(serial.rollout, f.name), getattr(overlapped.rollout, f.name)
        if isinstance(a, torch.Tensor):
            assert torch.equal(a, b), f.name
        elif isinstance(a, dict):
            assert all(torch.equal(a[k], b[k]) for k in a), f.name
        else:
            assert a == b, f.name
    assert serial.timings.keys() == overlapped.timings.keys()


def serial_and_overlapped(make: Any, iterations: int = 1) -> list[tuple[Any, Any]]:
    """``iterations`` collected batches of two trainers that differ only in the option."""
    serial, overlapped = make(False), make(True)
    return [
        (serial.collector.collect(i), overlapped.collector.collect(i)) for i in range(iterations)
    ]


@pytest.mark.parametrize(
    ("recipe", "overrides"),
    [
        ("digits_flow_grpo", ()),
        # Flow-GRPO-Fast: a shared ODE prefix, then the window, in chunks; the per-step KL.
        ("digits_flow_grpo", ("sampler.sde_window_size=2", "sampler.same_initial_noise=true")),
        ("digits_flow_grpo", ("algorithm.kl_reward=0.1",)),
        ("digits_ram", ()),
    ],
    ids=["flow_grpo", "fast_window", "kl_reward", "ram_endpoints"],
)
def test_digits_rewards_and_advantages_are_the_serial_ones(
    tmp_path: Path, recipe: str, overrides: tuple[str, ...]
) -> None:
    # 16 samples in chunks of 5: four chunks, the last one short.
    def make(overlap: bool) -> Trainer:
        config = tiny_config(
            tmp_path,
            "train.rollout_batch_size=5",
            f"train.overlap_rewards={str(overlap).lower()}",
            *overrides,
            recipe=recipe,
        )
        return Trainer(config, run_dir=tmp_path / f"run-{overlap}")

    for serial, overlapped in serial_and_overlapped(make, iterations=2):
        assert_same_batches(serial, overlapped)
    assert not reward_threads()


def test_tiny_sd3_rewards_and_advantages_are_the_serial_ones(tmp_path: Path) -> None:
    from diffusers_tiny import build_sd3
    from test_flow_image import image_config

    directory = build_sd3(tmp_path / "sd3")

    def make(overlap: bool) -> Trainer:
        config = image_config(tmp_path, "sd3", directory)
        config.train.prompts_per_iteration, config.train.group_size = 3, 3
        config.train.rollout_batch_size, config.train.overlap_rewards = 2, overlap
        return Trainer(config, run_dir=tmp_path / f"run-{overlap}")

    ((serial, overlapped),) = serial_and_overlapped(make)
    assert serial.scores["target_color"].shape == (9,)
    assert_same_batches(serial, overlapped)


class LetterA(RewardModel):
    """Share of the letter 'a' in a completion; records the metadata it was given."""

    name = "letter_a"
    seen: ClassVar[list] = []

    def score(self, outputs, prompts, metadata):  # type: ignore[no-untyped-def]
        LetterA.seen.append(metadata)
        values = [t.count("a") / max(len(t), 1) for t in outputs]
        return RewardOutput({self.name: torch.tensor(values)})


def test_token_rollout_is_scored_as_one_chunk_with_the_serial_results(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from test_causal_lm import lm_config, save_tiny_lm

    monkeypatch.setitem(REWARDS, "letter_a", LetterA)
    lm_dir = save_tiny_lm(tmp_path / "lm")

    def make(overlap: bool) -> Trainer:
        config = lm_config(tmp_path, lm_dir)
        config.train.rollout_batch_size, config.train.overlap_rewards = 3, overlap
        return Trainer(config, run_dir=tmp_path / f"run-{overlap}")

    LetterA.seen.clear()
    ((serial, overlapped),) = serial_and_overlapped(make)
    assert_same_batches(serial, overlapped)
    # Both were scored once, on all 8 completions with their lengths.
    assert [len(m) for m in LetterA.seen] == [8, 8]
    assert LetterA.seen[0] == LetterA.seen[1]
    assert "completion_length" in LetterA.seen[0][0]


class Scripted(RewardModel):
    """Score = sample's first pixel; NaN at the rows in ``bad``, raises when ``fail`` is set."""

    name = "scripted"
    bad: ClassVar[set[int]] = set()
    fail: ClassVar[bool] = False
    calls: ClassVar[list[tuple[str, int]]] = []  # (thread name, batch size)
    updates: ClassVar[list[tuple[str, int]]] = []

    def score(self, outputs, prompts, metadata):  # type: ignore[no-untyped-def]
        del metadata
        Scripted.calls.append((threading.current_thread().name, len(prompts)))
        if Scripted.fail:
            raise OSError("disk full")
        values = outputs.flatten(1)[:, 0].float().clone()
        seen = sum(n for _, n in Scripted.calls[:-1])
        for row in Scripted.bad:
            if seen <= row < seen + len(prompts):
                values[row - seen] = float("nan")
        return RewardOutput({self.name: values})

    def update(self, outputs, prompts, metadata=None, gather=None):  # type: ignore[no-untyped-def]
        Scripted.updates.append((threading.current_thread().name, len(outputs)))
        return {"seen": float(len(outputs))}


@pytest.fixture
def scripted(monkeypatch: pytest.MonkeyPatch) -> type[Scripted]:
    monkeypatch.setitem(REWARDS, "scripted", Scripted)
    Scripted.bad, Scripted.fail = set(), False
    Scripted.calls.clear()
    Scripted.updates.clear()
    return Scripted


def scripted_trainer(
    tmp_path: Path, overlap: bool, *overrides: str, recipe: str = "digits_flow_grpo"
) -> Trainer:
    config = tiny_config(
        tmp_path,
        "train.rollout_batch_size=5",
        f"train.overlap_rewards={str(overlap).lower()}",
        "reward.0.name=scripted",
        "reward.0.kwargs={}",
        *overrides,
        recipe=recipe,
    )
    return Trainer(config, run_dir=tmp_path / f"run-{overlap}")


def test_chunks_are_scored_in_a_worker_and_the_update_in_the_main_thread(
    tmp_path: Path, scripted: type[Scripted]
) -> None:
    batch = scripted_trainer(tmp_path, True).collector.collect(0)
    assert [n for _, n in scripted.calls] == [5, 5, 5, 1]
    assert all(name.startswith("genrl-reward") for name, _ in scripted.calls)
    # update: once, in the calling thread, on all 16 outputs.
    assert scripted.updates == [(threading.current_thread().name, 16)]
    assert batch.extra_metrics["reward_update/scripted/seen"] == 16.0
    assert not reward_threads()


@pytest.mark.parametrize("row", [2, 12])
def test_a_nan_names_its_row_in_the_batch_as_the_serial_path_does(
    tmp_path: Path, scripted: type[Scripted], row: int
) -> None:
    scripted.bad = {row}
    messages = []
    for overlap in (False, True):
        scripted.calls.clear()
        with pytest.raises(RewardError, match=f"for sample {row} ") as caught:
            scripted_trainer(tmp_path, overlap).collector.collect(0)
        messages.append(str(caught.value))
    assert messages[0] == messages[1]
    assert not reward_threads()


def test_a_failing_reward_stops_sampling_at_the_next_chunk(
    tmp_path: Path, scripted: type[Scripted], monkeypatch: pytest.MonkeyPatch
) -> None:
    scripted.fail = True
    trainer = scripted_trainer(tmp_path, True)
    sampled: list[slice] = []
    original = trainer.rollout._advance  # type: ignore[attr-defined]

    def advance(policy: Any, run: Any, rows: slice) -> None:
        # Sample chunk k only once the worker has tried chunk k - 1 (no race on the count).
        while len(scripted.calls) < len(sampled):
            threading.Event().wait(0.005)
        sampled.append(rows)
        original(policy, run, rows)

    monkeypatch.setattr(trainer.rollout, "_advance", advance)
    with pytest.raises(RewardError, match="reward model 'scripted' raised: OSError"):
        trainer.collector.collect(0)
    # Chunk 0 failed before chunk 1 started or while it sampled (both are allowed: the main
    # thread looks for errors before each chunk); either way the error surfaced before chunk 2,
    # of the batch's four chunks.
    assert 1 <= len(sampled) <= 2
    assert not reward_threads()


def test_an_interrupt_while_sampling_cancels_the_queued_chunks(
    tmp_path: Path, scripted: type[Scripted], monkeypatch: pytest.MonkeyPatch
) -> None:
    trainer = scripted_trainer(tmp_path, True)
    original = trainer.rollout._advance  # type: ignore[attr-defined]

    def advance(policy: Any, run: Any, rows: slice) -> None:
        if rows.start == 10:
            raise KeyboardInterrupt
        original(policy, run, rows)

    monkeypatch.setattr(trainer.rollout, "_advance", advance)
    with pytest.raises(KeyboardInterrupt):
        trainer.collector.collect(0)
    assert not reward_threads()
    assert len(scripted.calls) <= 2 and not scripted.updates


def test_an_interrupt_inside_a_lagged_chunk_restores_the_live_weights(
    tmp_path: Path, scripted: type[Scripted], monkeypatch: pytest.MonkeyPatch
) -> None:
    trainer = scripted_trainer(
        tmp_path, True, "algorithm.sampling_ema_decay=0.5", recipe="digits_ram"
    )
    trainer.train_iteration()  # the live weights and the lagged copy now differ
    live = {n: p.detach().clone() for n, p in trainer.policy.network.named_parameters()}
    velocity, calls = trainer.policy.velocity, []

    def interrupted(*args: Any, **kwargs: Any) -> torch.Tensor:
        calls.append(1)
        if len(calls) == 6:  # in the second chunk (4 steps per chunk)
            raise KeyboardInterrupt
        return velocity(*args, **kwargs)

    monkeypatch.setattr(trainer.policy, "velocity", interrupted)
    with pytest.raises(KeyboardInterrupt):
        trainer.collector.collect(1)
    after = dict(trainer.policy.network.named_parameters())
    assert any(not torch.equal(live[n], p) for n, p in trainer.rollout.lagged.shadow.items())  # type: ignore[attr-defined]
    assert all(torch.equal(live[n], after[n]) for n in live)
    assert not reward_threads()


class Slow(RewardModel):
    """Three calls must run at once (else the barrier breaks after 30 s), and later chunks
    finish first: the assembled scores must still be in row order."""

    name = "slow"
    concurrent_calls = 3
    barrier: ClassVar[threading.Barrier | None] = None

    def score(self, outputs, prompts, metadata):  # type: ignore[no-untyped-def]
        del prompts, metadata
        if Slow.barrier is not None:
            Slow.barrier.wait()
        first = float(outputs[0])
        threading.Event().wait(0.02 * (3 - first))
        return RewardOutput({self.name: outputs.flatten().float() * 10})


def test_concurrent_calls_run_at_once_and_are_assembled_in_row_order() -> None:
    Slow.barrier = threading.Barrier(3, timeout=30)
    worker = RewardWorker(CompositeReward([(Slow(), 1.0)]))
    assert worker.pool._max_workers == 3
    try:
        for start in range(3):
            rows = slice(2 * start, 2 * start + 2)
            outputs = torch.arange(rows.start, rows.stop).float().view(-1, 1, 1, 1)
            worker.submit(rows, outputs / 2, ["p", "p"], None)
        scores = worker.scores()
    finally:
        worker.close()
        Slow.barrier = None
    assert scores["reward"].tolist() == [0.0, 5.0, 10.0, 15.0, 20.0, 25.0]


def test_reward_error_shifts_its_sample_and_keeps_the_rest() -> None:
    error = RewardError.about_sample("reward 'x' returned nan for sample ", 3, " (prompt 'a')")
    assert str(error.shifted(10)) == "reward 'x' returned nan for sample 13 (prompt 'a')"
    assert error.shifted(10).sample == 13 and error.shifted(0) is error
    plain = RewardError("reward model 'x' raised: OSError()")
    assert plain.shifted(5) is plain


def test_remote_reward_allows_concurrent_requests() -> None:
    from reward_models.remote import RemoteReward

    assert RemoteReward("http://127.0.0.1:1").concurrent_calls == 4
    assert RemoteReward("http://127.0.0.1:1", concurrent_requests=1).concurrent_calls == 1
    with pytest.raises(ValueError, match="concurrent_requests"):
        RemoteReward("http://127.0.0.1:1", concurrent_requests=0)
    # A composite with one single-threaded member scores one chunk at a time.
    mixed = CompositeReward([(RemoteReward("http://127.0.0.1:1"), 1.0), (Scripted(), 1.0)])
    assert mixed.concurrent_calls == 1
    assert CompositeReward([(RemoteReward("http://127.0.0.1:1"), 1.0)]).concurrent_calls == 4


class OneChunk:
    """A rollout whose ``stream`` (one chunk) disagrees with its ``chunks`` (two)."""

    def chunks(self, num_samples: int) -> list[slice]:
        return [slice(0, 2), slice(2, num_samples)]

    def stream(self, policy: Any, prompts: list[str], group_ids: Any, noise: Any) -> Any:
        yield Chunk(slice(0, len(prompts)), torch.zeros(len(prompts), 1, 1, 1))
        return "batch"

    def outputs(self, policy: Any, batch: torch.Tensor) -> torch.Tensor:
        return batch

    def reward_metadata(self, batch: Any) -> None:
        return None


def test_a_stream_that_does_not_yield_its_chunks_is_refused() -> None:
    with pytest.raises(ValueError, match=r"OneChunk.stream yielded rows slice\(0, 4, None\) as"):
        sample_and_score(
            OneChunk(),  # type: ignore[arg-type]
            None,
            ["a", "b", "c", "d"],
            torch.zeros(4),
            None,
            CompositeReward([(Slow(), 1.0)]),
            contextlib.nullcontext,
        )
    assert not reward_threads()
