"""Replica failover: a replica whose reward call raises is taken out of rotation and its
requests are retried once on a healthy replica, every sample scored by exactly one successful
call (counted by a reward that records what it scored); ``/health`` says which replica is out
and why; a request the reward refuses (``RewardInputError``) takes no replica out."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import torch

from reward_models import RewardError, RewardInputError, RewardOutput
from reward_models.color import TargetColorReward
from reward_models.remote import RemoteReward
from reward_models.serving.server import RewardServer
from reward_models.wire import quantize

CUDA = "CUDA error: an illegal memory access was encountered"


class Recording(TargetColorReward):
    """Scores as ``target_color`` and records, per successful call, the prompts it scored;
    raises ``error`` instead for prompts starting with ``fails_on`` (all when empty)."""

    def __init__(self, fails_on: str | None = None, error: Exception | None = None) -> None:
        super().__init__()
        self.fails_on, self.error = fails_on, error
        self.calls = 0
        self.scored: list[str] = []
        self._lock = threading.Lock()

    def score(self, outputs, prompts, metadata) -> RewardOutput:  # type: ignore[no-untyped-def]
        with self._lock:
            self.calls += 1
        if self.error is not None and any(p.startswith(self.fails_on or "") for p in prompts):
            raise self.error
        result = super().score(outputs, prompts, metadata)
        with self._lock:
            self.scored.extend(prompts)
        return result


def broken() -> Recording:
    return Recording(error=RuntimeError(f"{CUDA}\nCUDA kernel errors might be reported later"))


def images(n: int, seed: int) -> torch.Tensor:
    return torch.rand(n, 3, 8, 8, generator=torch.Generator().manual_seed(seed))


def expected(batch: torch.Tensor) -> torch.Tensor:
    sent = quantize(batch).float() / 255
    return TargetColorReward()(sent, ["p"] * len(batch)).scores["target_color"]


@pytest.fixture
def servers() -> Iterator[list[RewardServer]]:
    started: list[RewardServer] = []
    yield started
    for server in started:
        server.shutdown()


def scored_by(*rewards: Recording) -> Counter[str]:
    return Counter(p for reward in rewards for p in reward.scored)


def test_a_replica_raising_a_device_error_fails_over_and_nothing_is_scored_twice(
    servers,
) -> None:
    """40 concurrent requests of 1-3 images (79 in all) on [broken, healthy]: all 200 with their own
    scores, each prompt scored once, the broken replica called once and then out of
    rotation."""
    bad, good = broken(), Recording()
    server = RewardServer([bad, good], port=0, max_batch_size=8).start()
    servers.append(server)

    def client(index: int) -> tuple[list[str], torch.Tensor, torch.Tensor]:
        remote = RemoteReward(server.address, name="c", retries=0, timeout_s=60)
        batch = images(1 + index % 3, seed=index)
        prompts = [f"r{index}-{j}" for j in range(len(batch))]
        scores = remote(batch, prompts).scores["c"]
        remote.close()
        return prompts, batch, scores

    with ThreadPoolExecutor(16) as pool:
        answered = [f.result(timeout=120) for f in [pool.submit(client, i) for i in range(40)]]
    sent: list[str] = []
    for prompts, batch, scores in answered:
        torch.testing.assert_close(scores, expected(batch), rtol=0, atol=1e-7)
        sent += prompts
    assert len(sent) == 79 and scored_by(bad, good) == Counter(sent)  # each exactly once
    assert set(scored_by(good).values()) == {1}
    assert bad.calls == 1 and bad.scored == []  # out of rotation after its first call
    health = server.describe()["replica_health"]
    assert health == [
        {"replica": 0, "state": "out of rotation", "failed_calls": 1,
         "last_error": f"RuntimeError: {CUDA}"},
        {"replica": 1, "state": "healthy", "failed_calls": 0, "last_error": None},
    ]  # fmt: skip
    assert all(r.load == 0 for r in server.replicas.members)
    assert server.limits.pixels.in_use == 0


def test_the_parts_of_a_large_request_fail_over_on_their_own(servers) -> None:
    """10 samples with max_batch_size 4: parts of 4, 4 and 2; the ones sent to the broken
    replica are retried on the healthy one; the reply holds the 10 scores in order."""
    bad, good = broken(), Recording()
    server = RewardServer([bad, good], port=0, max_batch_size=4).start()
    servers.append(server)
    batch = images(10, seed=7)
    prompts = [f"s{i}" for i in range(10)]
    scores = RemoteReward(server.address, name="c", retries=0, max_batch_size=10)(batch, prompts)
    torch.testing.assert_close(scores.scores["c"], expected(batch), rtol=0, atol=1e-7)
    assert scored_by(bad, good) == Counter(prompts) and bad.calls == 1
    assert sorted(server.replicas[1].batch_sizes) == [2, 4, 4]


def test_a_refused_request_takes_no_replica_out(servers) -> None:
    refusing = [Recording("bad", RewardInputError("cannot score 'bad'")) for _ in range(2)]
    server = RewardServer(refusing, port=0).start()
    servers.append(server)
    remote = RemoteReward(server.address, name="c", retries=0)
    with pytest.raises(RewardError, match=r"\(422\): cannot score 'bad'"):
        remote(images(1, 0), ["bad"])
    assert [r["state"] for r in server.describe()["replica_health"]] == ["healthy"] * 2
    assert [r["failed_calls"] for r in server.describe()["replica_health"]] == [0, 0]
    assert sum(r.calls for r in refusing) == 1  # refused, not retried elsewhere


def test_a_request_failing_everywhere_is_a_500_and_costs_one_replica(servers) -> None:
    """A request on which every replica raises (the reward's bug on that input, not a
    device's): replica 0 is taken out, the retry fails on replica 1 too, and since that job
    had failed before, replica 1 stays in rotation; the next request is scored."""
    rewards = [Recording("poison", ValueError("reward bug")) for _ in range(3)]
    server = RewardServer(rewards, port=0).start()
    servers.append(server)
    remote = RemoteReward(server.address, name="c", retries=0)
    with pytest.raises(RewardError, match=r"\(500\): internal error"):
        remote(images(1, 0), ["poison"])
    states = [r["state"] for r in server.describe()["replica_health"]]
    assert states == ["out of rotation", "healthy", "healthy"]
    assert [r.calls for r in rewards] == [1, 1, 0]  # retried once, no more
    assert remote(images(2, 1), ["ok", "ok"]).scores["c"].shape == (2,)
    assert server.describe()["replica_health"][1]["last_error"] == "ValueError: reward bug"


def test_the_last_replica_in_rotation_stays_and_answers_500(servers) -> None:
    """No replica is left to retry on: the failure is the server's, a 500 (not a 503, which
    would send the client back to a replica that fails again); the replica stays in rotation,
    so a server whose error passes (or was one request's) goes on serving."""
    reward = Recording("poison", RuntimeError(CUDA))
    server = RewardServer(reward, port=0).start()
    servers.append(server)
    remote = RemoteReward(server.address, name="c", retries=0)
    for _ in range(2):
        with pytest.raises(RewardError, match=r"\(500\)"):
            remote(images(1, 0), ["poison"])
    health: list[dict[str, Any]] = server.describe()["replica_health"]
    assert health == [{"replica": 0, "state": "healthy", "failed_calls": 2,
                       "last_error": f"RuntimeError: {CUDA}"}]  # fmt: skip
    assert remote(images(1, 0), ["fine"]).scores["c"].shape == (1,)
