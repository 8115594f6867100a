"""The reward server and its client over real loopback sockets."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import torch

from reward_models import REWARDS, CallableReward, RewardError, RewardModel, RewardOutput
from reward_models.color import TargetColorReward
from reward_models.remote import RemoteReward
from reward_models.serving.server import RewardServer
from reward_models.wire import encode_outputs, quantize


def images(n: int, seed: int = 0, size: int = 8) -> torch.Tensor:
    return torch.rand(n, 3, size, size, generator=torch.Generator().manual_seed(seed))


@pytest.fixture
def color_server():
    server = RewardServer(TargetColorReward(), port=0, token="s3cret").start()
    yield server
    server.shutdown()


def client(server: RewardServer, **kwargs) -> RemoteReward:
    options = {"name": "target_color", "token": "s3cret", "retries": 0} | kwargs
    return RemoteReward(server.address, **options)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_remote_scores_equal_local_scores_of_the_sent_images(color_server) -> None:
    batch = images(5)
    remote = client(color_server)(batch, ["p"] * 5).scores["target_color"]
    local = TargetColorReward()(quantize(batch).float() / 255, ["p"] * 5).scores["target_color"]
    torch.testing.assert_close(remote, local, rtol=0, atol=1e-7)
    # PNG carries 8-bit images exactly, so the only change is rounding to 256 levels.
    direct = TargetColorReward()(batch, ["p"] * 5).scores["target_color"]
    assert float((remote - direct).abs().max()) < 5e-3


def test_texts_metadata_and_not_applicable_scores_travel() -> None:
    def length_if_long(prompts, completions, completion_length):  # TRL signature
        return [float(n) if n > 3 else None for n in completion_length]

    server = RewardServer(CallableReward(length_if_long), port=0).start()
    try:
        remote = RemoteReward(server.address, name="length", retries=0)
        out = remote(
            ["ab", "abcdef"], ["p", "q"], [{"completion_length": 2}, {"completion_length": 6}]
        )
    finally:
        server.shutdown()
    assert out.applicable["length"].tolist() == [False, True]
    assert torch.isnan(out.scores["length"][0]) and out.scores["length"][1] == 6.0


def test_requests_are_split_and_merged_into_batches() -> None:
    server = RewardServer(TargetColorReward(), port=0, max_batch_size=4, batch_wait_s=0.3).start()
    try:
        remote = RemoteReward(server.address, name="c", retries=0, max_batch_size=10)
        expected = TargetColorReward()(quantize(images(10)).float() / 255, ["p"] * 10)
        torch.testing.assert_close(
            remote(images(10), ["p"] * 10).scores["c"], expected.scores["target_color"]
        )
        assert server.batch_sizes == [4, 4, 2]  # one request of 10, split
        server.batch_sizes.clear()
        results: dict[int, torch.Tensor] = {}

        def send(i: int) -> None:
            results[i] = remote(images(2, seed=i), ["p"] * 2).scores["c"]

        threads = [threading.Thread(target=send, args=(i,)) for i in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        server.shutdown()
    assert max(server.batch_sizes) == 4 and sum(server.batch_sizes) == 8  # merged requests
    for i, scores in results.items():  # every request got its own rows back
        own = TargetColorReward()(quantize(images(2, seed=i)).float() / 255, ["p"] * 2)
        torch.testing.assert_close(scores, own.scores["target_color"])


def test_wrong_or_missing_token_is_rejected_at_once(color_server) -> None:
    started = time.monotonic()
    with pytest.raises(RewardError, match="rejected the token"):
        client(color_server, token="wrong", retries=3, backoff_s=1.0)(images(1), ["p"])
    with pytest.raises(RewardError, match="rejected the token"):
        client(color_server, token="", token_env="GENRL_TEST_UNSET", retries=3)(images(1), ["p"])
    assert time.monotonic() - started < 1.0  # not retried


def test_a_token_is_required_beyond_loopback() -> None:
    with pytest.raises(ValueError, match="without a token"):
        RewardServer(TargetColorReward(), host="0.0.0.0", port=0)


def post(url: str, body: bytes, token: str = "s3cret") -> tuple[int, dict]:
    request = urllib.request.Request(
        url + "/score", body, {"Authorization": f"Bearer {token}"}, method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"{not json", "not JSON"),
        (b"[1, 2]", "JSON object"),
        (json.dumps({"version": 9, "prompts": []}).encode(), "wire version"),
        (json.dumps({"version": 1, "prompts": [1], "outputs": {}}).encode(), "prompts"),
        (
            json.dumps({"version": 1, "prompts": ["a"], "outputs": {"images": ["@@@"]}}).encode(),
            "base64-encoded PNG",
        ),
        (
            json.dumps(
                {"version": 1, "prompts": ["a", "b"], "outputs": encode_outputs(images(1))}
            ).encode(),
            "1 outputs but 2 prompts",
        ),
    ],
)
def test_malformed_requests_get_a_clear_400(color_server, body: bytes, message: str) -> None:
    status, reply = post(color_server.address, body)
    assert status == 400 and message in reply["error"]


def test_oversized_requests_are_refused(color_server) -> None:
    color_server.max_request_bytes = 200
    with pytest.raises(RewardError, match=r"\(413\).*exceeds 200"):
        client(color_server)(images(4), ["p"] * 4)
    status, _ = post(color_server.address, b"x" * 1000)
    assert status == 413


class Slow(RewardModel):
    name = "slow"

    def score(self, outputs, prompts, metadata):  # type: ignore[no-untyped-def]
        time.sleep(0.5)
        return RewardOutput({self.name: torch.zeros(len(prompts))})


def test_a_slow_reward_times_out_with_504() -> None:
    server = RewardServer(Slow(), port=0, request_timeout_s=0.1).start()
    try:
        with pytest.raises(RewardError, match=r"HTTP 504.*not scored within 0.1 s"):
            RemoteReward(server.address, name="slow", retries=0)(["a"], ["p"])
    finally:
        server.shutdown()


def test_a_server_that_is_down_fails_clearly_and_one_that_comes_back_is_retried() -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with pytest.raises(RewardError, match=r"failed 2 times.*serve-reward"):
        RemoteReward(url, name="c", retries=1, backoff_s=0.01)(images(2), ["p"] * 2)
    server = RewardServer(TargetColorReward(), port=port)
    threading.Timer(0.2, server.start).start()  # up during the client's back-off
    try:
        scores = RemoteReward(url, name="c", retries=6, backoff_s=0.05)(images(2), ["p"] * 2)
    finally:
        time.sleep(0.3)
        server.shutdown()
    # The scores of the images as sent (8-bit PNG), as the local reward gives them.
    sent = (images(2) * 255).round() / 255
    expected = TargetColorReward()(sent, ["p"] * 2).scores["target_color"]
    torch.testing.assert_close(scores.scores["c"], expected, rtol=0, atol=1e-6)


def test_trainer_with_a_remote_reward_survives_a_server_restart(tmp_path: Path) -> None:
    """The toy task scored by a digit classifier behind a server: same scores as the local
    classifier on the sent images, a clear error while the server is down (iteration not
    counted), training continues once it is back."""
    from tiny import tiny_config

    from genrl.loop.trainer import Trainer
    from reward_models import build_reward

    config = tiny_config(tmp_path)
    local = build_reward("digit_classifier", **config.reward[0].kwargs)
    port = free_port()
    server = RewardServer(local, port=port, token="t").start()
    config.reward[0].name = "remote"
    url = f"http://127.0.0.1:{port}"
    config.reward[0].kwargs = {
        "url": url, "name": "digit_classifier", "token": "t", "max_batch_size": 3,
        "retries": 1, "backoff_s": 0.01,
    }  # fmt: skip
    trainer = Trainer(config, run_dir=tmp_path / "run")
    batch = trainer.collect()
    outputs = trainer.rollout.outputs(trainer.policy, batch.rollout)
    expected = local(quantize(outputs).float() / 255, batch.rollout.prompts).scores
    assert len(batch.scores["reward"]) == 16  # every sample once, in 3-sample requests
    torch.testing.assert_close(batch.scores["reward"], expected["digit_classifier"])
    trainer.train_iteration()
    server.shutdown()
    with pytest.raises(RewardError, match=f"{url}/score failed 2 times"):
        trainer.train_iteration()
    assert trainer.iteration == 1
    server = RewardServer(local, port=port, token="t").start()
    try:
        trainer.train_iteration()
    finally:
        server.shutdown()
    assert trainer.iteration == 2


@pytest.mark.slow
def test_cli_serves_a_registered_reward(tmp_path: Path) -> None:
    port = free_port()
    env = dict(os.environ, GENRL_REWARD_TOKEN="abc")
    command = [
        sys.executable,
        "-m",
        "genrl.cli.main",
        "serve-reward",
        "target_color",
        "--port",
        str(port),
    ]
    command += ["--kwargs", '{"target": [0, 1, 0]}']
    command += ["--max-request-mpix", "0.5", "--pixel-budget-mpix", "1", "--max-decodes", "2"]
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}"
        remote = RemoteReward(url, name="green", token="abc", retries=0)
        scores = None
        deadline = time.monotonic() + 60
        while scores is None and time.monotonic() < deadline:
            try:
                scores = remote(torch.zeros(1, 3, 4, 4), ["p"]).scores["green"]
            except RewardError:
                time.sleep(0.2)
        assert scores is not None, process.stdout.read().decode() if process.stdout else ""
        assert scores.tolist() == [pytest.approx(1 - 1 / 3)]  # black vs green: distance 1
        health = urllib.request.Request(url + "/health", headers={"Authorization": "Bearer abc"})
        with urllib.request.urlopen(health, timeout=10) as reply:
            limits = json.loads(reply.read())["limits"]
        assert limits["max_pixels"] == 2**19 and limits["pixel_budget"] == 2**20
    finally:
        process.terminate()
        process.wait(timeout=10)


def test_remote_is_registered() -> None:
    assert "remote" in REWARDS


def raw_request(address: str, data: bytes) -> bytes:
    """Send raw bytes over one connection and return everything the server answers."""
    host, port = address.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=5) as connection:
        connection.sendall(data)
        chunks = []
        while True:
            try:
                chunk = connection.recv(65536)
            except TimeoutError:
                break
            if not chunk:
                break
            chunks.append(chunk)
    return b"".join(chunks)


def test_negative_length_and_refused_bodies_do_not_leak(color_server) -> None:
    reply = raw_request(
        color_server.address,
        b"POST /score HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer s3cret\r\nContent-Length: -1\r\n\r\n{}",
    )
    # h11's message is "bad Content-Length".
    assert reply.startswith(b"HTTP/1.1 400") and b" Content-Length" in reply
    # A refused request's unread body is never parsed as a second request on the connection.
    smuggled = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
    head = f"POST /score HTTP/1.1\r\nHost: x\r\nContent-Length: {len(smuggled)}\r\n\r\n".encode()
    reply = raw_request(color_server.address, head + smuggled)
    assert reply.count(b"HTTP/1.1 ") == 1 and reply.startswith(b"HTTP/1.1 401")


def test_images_beyond_the_pixel_limit_are_refused_before_decoding() -> None:
    server = RewardServer(TargetColorReward(), port=0, max_pixels=1000).start()
    try:
        body = json.dumps(
            {"version": 1, "prompts": ["a", "b"], "outputs": encode_outputs(images(2, size=24))}
        )
        status, reply = post(server.address, body.encode(), token="")
    finally:
        server.shutdown()
    assert status == 400 and "pixel limit" in reply["error"]  # 2 x 576 pixels > 1000


class Counting(RewardModel):
    name = "counting"
    calls = 0

    def score(self, outputs, prompts, metadata):  # type: ignore[no-untyped-def]
        Counting.calls += 1
        time.sleep(0.3)
        return RewardOutput({self.name: torch.zeros(len(prompts))})


def test_requests_that_timed_out_are_not_scored_later() -> None:
    server = RewardServer(Counting(), port=0, request_timeout_s=0.1, batch_wait_s=0.0).start()
    errors: list[Exception] = []

    def ask() -> None:
        try:
            RemoteReward(server.address, name="c", retries=0)(["a"], ["p"])
        except RewardError as err:
            errors.append(err)

    try:
        threads = [threading.Thread(target=ask) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        time.sleep(0.8)
    finally:
        server.shutdown()
    assert len(errors) == 4 and all("504" in str(e) for e in errors)
    assert Counting.calls < 4  # the queued ones were dropped once their clients had a 504


class _BrighteningReward(RewardModel):
    """Mean of the last frame minus the first: a reward only a video has."""

    name = "brightening"
    accepts = ("videos",)

    def score(self, outputs, prompts, metadata) -> RewardOutput:
        return RewardOutput({self.name: (outputs[:, -1] - outputs[:, 0]).mean(dim=(1, 2, 3))})


def test_videos_travel_frame_by_frame_and_merge_by_shape() -> None:
    videos = torch.rand(5, 4, 3, 8, 8, generator=torch.Generator().manual_seed(3))
    server = RewardServer(_BrighteningReward(), port=0, max_batch_size=3).start()
    try:
        remote = RemoteReward(server.address, name="brightening", retries=0)
        scores = remote(videos, ["p"] * 5).scores["brightening"]
        # An image server refuses videos before decoding them, naming both kinds.
        color = RewardServer(TargetColorReward(), port=0).start()
        try:
            with pytest.raises(RewardError, match="accepts images, not videos"):
                RemoteReward(color.address, name="target_color", retries=0)(videos, ["p"] * 5)
        finally:
            color.shutdown()
    finally:
        server.shutdown()
    expected = _BrighteningReward()(quantize(videos).float() / 255, ["p"] * 5).scores
    torch.testing.assert_close(scores, expected["brightening"], rtol=0, atol=1e-7)
    assert server.batch_sizes == [3, 2]


def test_an_image_reward_given_videos_names_the_frame_wrapper() -> None:
    with pytest.raises(ValueError, match=r"scores images, got videos.*FrameReward"):
        TargetColorReward()(torch.rand(2, 3, 3, 8, 8), ["a", "b"])


def test_columns_json_cannot_carry_stay_home() -> None:
    """A prompt's in-memory images (dataset columns) are not sent to a reward server; the JSON
    columns are."""
    from PIL import Image

    seen: list[dict] = []

    def record(prompts, completions, **columns):
        seen.append(columns)
        return [1.0] * len(prompts)

    server = RewardServer(CallableReward(record, name="record"), port=0).start()
    try:
        remote = RemoteReward(server.address, name="record", retries=0)
        metadata = [{"answer": "3", "images": [Image.new("RGB", (4, 4))]}]
        assert remote(["a"], ["p"], metadata).scores["record"].tolist() == [1.0]
    finally:
        server.shutdown()
    assert seen == [{"answer": ["3"]}]
