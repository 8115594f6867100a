"""generation.engine=vllm on the CPU build of vLLM (the engine lane, .ci/vllm_lane): its ids and
log-probs against training's recomputation, the weight sync (full fine-tuning and LoRA), and a
GRPO run through the engine. Skipped, saying why, where vLLM is not installed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

# In process (the multiprocess engine core does not start on the CPU build); set before import.
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
pytest.importorskip(
    "vllm", reason="vLLM is not installed here: the engine lane (.ci/vllm_lane) runs these tests"
)

from genrl import get_recipe
from genrl.data.rng import RolloutNoise
from genrl.rollouts.engines.vllm_engine import VLLMEngine
from genrl.rollouts.tokens import AutoregressiveRollout
from pipelines import build_policy
from tests.engine_tiny import save_engine_lm

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]
PROMPTS = ["3 5 7 = 15 :"] * 4 + ["2 4 6 = 12 :"] * 4
# float32 on both sides: what is left is the kernels' summation order.
TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_engine_lm(tmp_path_factory.mktemp("engine_lm"))


@pytest.fixture(scope="module")
def rollout(checkpoint: Path) -> AutoregressiveRollout:
    """One engine for the module's tests (building one takes seconds): each test pushes the
    weights of the policy it samples from first."""
    config = get_recipe("llm_countdown_grpo").apply_overrides(
        [
            "policy.name=causal_lm",
            f"policy.pretrained={checkpoint}",
            "generation.engine=vllm",
            "generation.max_new_tokens=16",
        ]
    )
    config.validate()
    return AutoregressiveRollout(config)


def full_policy(checkpoint: Path, lora_rank: int = 0) -> Any:
    policy = build_policy("causal_lm", pretrained=str(checkpoint))
    policy.setup_training(lora_rank, 0.0, None)
    return policy


def sample(rollout: AutoregressiveRollout, policy: Any, iteration: int = 0) -> Any:
    noise = RolloutNoise(0, iteration, len(PROMPTS), slice(0, len(PROMPTS)))
    return rollout.collect(policy, PROMPTS, torch.arange(len(PROMPTS)) // 4, noise)


def log_prob_gap(rollout: AutoregressiveRollout, policy: Any, batch: Any) -> float:
    """Largest ``|engine - trainer|`` log-prob over the trained tokens of ``batch``."""
    completion = batch.input_ids[:, batch.completion_start :]
    with torch.no_grad():
        trainer = policy.token_log_probs(
            batch.input_ids, batch.attention_mask, completion, rollout.sampler.temperature
        )
    counted = batch.completion_mask
    return float((trainer - batch.sampler_log_probs)[counted].abs().max())


def perturb(policy: Any, scale: float = 0.05) -> None:
    """What an optimizer step does to the trainable weights, larger."""
    with torch.no_grad():
        for parameter in policy.trainable_parameters():
            parameter.add_(scale * torch.randn_like(parameter))


def test_engine_ids_and_log_probs_agree_with_training(
    rollout: AutoregressiveRollout, checkpoint: Path
) -> None:
    policy = full_policy(checkpoint)
    assert isinstance(rollout.engine, VLLMEngine)
    rollout.sync_weights(policy)
    batch = sample(rollout, policy)
    assert batch.completion_mask.sum(1).min() >= 1
    gap = log_prob_gap(rollout, policy, batch)
    print(f"max |engine - trainer| log-prob, float32: {gap:.3g}")
    assert gap < TOLERANCE
    # Seeded from the run's token stream: the same noise draws the same completions, another
    # iteration others; the two groups differ from each other.
    again = sample(rollout, policy)
    assert torch.equal(again.input_ids, batch.input_ids)
    assert not torch.equal(sample(rollout, policy, iteration=1).input_ids, batch.input_ids)
    assert len(set(batch.completions)) > 1


def test_weight_sync_makes_the_engine_follow_the_trainer(
    rollout: AutoregressiveRollout, checkpoint: Path
) -> None:
    policy = full_policy(checkpoint)
    rollout.sync_weights(policy)
    perturb(policy)
    stale = log_prob_gap(rollout, policy, sample(rollout, policy))
    seconds = rollout.sync_weights(policy)
    assert seconds is not None and seconds > 0
    synced = log_prob_gap(rollout, policy, sample(rollout, policy))
    print(f"weight sync {seconds:.3f} s; gap before {stale:.3g}, after {synced:.3g}")
    assert stale > 100 * TOLERANCE  # the engine did sample from the old weights
    assert synced < TOLERANCE


def test_the_recipe_batch_samples_in_one_call(
    rollout: AutoregressiveRollout, checkpoint: Path
) -> None:
    """The recipe's 32 groups of 8 at once: more prompt tokens than one engine step takes,
    which with chunked prefill made vLLM rewind a seeded CPU generator and fail."""
    policy = full_policy(checkpoint)
    rollout.sync_weights(policy)
    # 25 tokens each: 6,400 prompt tokens against vLLM's 4,096 a step.
    prompts = [
        " ".join(str(a + k) for k in range(6)) + f" = {6 * a + 15} :"
        for a in range(10, 42)
        for _ in range(8)
    ]
    noise = RolloutNoise(0, 0, len(prompts), slice(0, len(prompts)))
    batch = rollout.collect(policy, prompts, torch.arange(len(prompts)) // 8, noise)
    assert batch.completion_mask.shape[0] == 256
    assert log_prob_gap(rollout, policy, batch) < TOLERANCE


def test_a_lora_adapter_reaches_the_engine_merged(
    rollout: AutoregressiveRollout, checkpoint: Path
) -> None:
    policy = full_policy(checkpoint, lora_rank=4)
    perturb(policy, scale=0.2)  # lora_B starts at zero: now the adapter changes the model
    rollout.sync_weights(policy)
    assert log_prob_gap(rollout, policy, sample(rollout, policy)) < TOLERANCE


def test_grpo_through_the_engine_trains(checkpoint: Path, tmp_path: Path) -> None:
    """Two iterations of `genrl train` with the engine (a process of its own, as a user runs
    it): the exported weights moved, and the metrics carry the sync time and the mismatch."""
    from safetensors.torch import load_file

    run = tmp_path / "run"
    settings = [
        "policy.name=causal_lm",
        f"policy.pretrained={checkpoint}",
        "generation.engine=vllm",
        "algorithm.tis_cap=2.0",
        # A random model solves no Countdown problem: DAPO's length penalty gives its groups
        # differing rewards, hence a gradient.
        "reward.1.name=overlong_penalty",
        "reward.1.kwargs.max_length=8",
        "reward.1.kwargs.buffer=8",
        "train.iterations=2",
        "train.prompts_per_iteration=4",
        "train.inner_epochs=1",
        "eval.batch_size=16",
        "logging.report_to=[]",
        "logging.progress_bar=false",
    ]
    command = [sys.executable, "-m", "genrl.cli.main", "train", "llm_countdown_grpo"]
    for setting in settings:
        command += ["--set", setting]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(
        [*command, "--output-dir", str(run)], env=env, capture_output=True, text=True, timeout=540
    )
    assert done.returncode == 0, done.stderr[-3000:]
    before = load_file(checkpoint / "model.safetensors")
    after = load_file(run / "export" / "model.safetensors")
    moved = max(float((after[k].float() - before[k].float()).abs().max()) for k in before)
    assert moved > 1e-6
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    trained = [r for r in rows if "time/weight_sync" in r]
    assert len(trained) == 2
    assert all(r["loss/mismatch_max_abs_diff"] < TOLERANCE for r in trained)
    assert all(0 <= r["loss/tis_truncated_fraction"] <= 1 for r in trained)


def test_stale_rollouts_through_the_engine(checkpoint: Path, tmp_path: Path) -> None:
    """train.max_staleness=1 with the engine: the sampling thread syncs the engine to the
    version each iteration samples from (the initial weights for iterations 0 and 1), the run
    trains, and the lag shows in the mismatch once the weights have moved."""
    run = tmp_path / "run"
    settings = [
        "policy.name=causal_lm",
        f"policy.pretrained={checkpoint}",
        "generation.engine=vllm",
        "train.max_staleness=1",
        "algorithm.tis_cap=2.0",
        "reward.1.name=overlong_penalty",
        "reward.1.kwargs.max_length=8",
        "reward.1.kwargs.buffer=8",
        "train.iterations=3",
        "train.prompts_per_iteration=4",
        "train.inner_epochs=1",
        "optim.lr=1e-3",
        "eval.batch_size=16",
        "logging.report_to=[]",
        "logging.progress_bar=false",
    ]
    command = [sys.executable, "-m", "genrl.cli.main", "train", "llm_countdown_grpo"]
    for setting in settings:
        command += ["--set", setting]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(
        [*command, "--output-dir", str(run)], env=env, capture_output=True, text=True, timeout=540
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    trained = [r for r in rows if "staleness/version_lag" in r]
    assert [r["staleness/version_lag"] for r in trained] == [0.0, 1.0, 1.0]
    # Versions 0, 0, 1: the engine is built on the first rollout with version 0's weights and
    # loads new ones once, for iteration 2.
    assert ["time/weight_sync" in r for r in trained] == [False, False, True]
    # Iteration 0 is on-policy up to the kernels; iteration 1 samples from weights one
    # update older than the trainer's.
    assert trained[0]["loss/mismatch_max_abs_diff"] < TOLERANCE
    assert trained[1]["loss/mismatch_max_abs_diff"] > 10 * TOLERANCE


def _free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_the_rollout_server_samples_what_the_colocated_engine_samples(
    rollout: AutoregressiveRollout, checkpoint: Path
) -> None:
    """`genrl serve-rollout` in a process of its own and `generation.engine=vllm_server` in
    this one: the same ids and log-probs as the colocated engine for the same seeds and
    weights, the weight push makes it follow the trainer, and a bad request is a 400."""
    import time

    import httpx

    port = _free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    command = [sys.executable, "-m", "genrl.cli.main", "serve-rollout", str(checkpoint)]
    server = subprocess.Popen(
        [*command, "--port", str(port)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while True:
            assert server.poll() is None, server.stdout.read() if server.stdout else ""
            try:
                health = httpx.get(f"{url}/health", timeout=5).json()
                break
            except httpx.HTTPError:
                assert time.monotonic() < deadline, "the rollout server did not start"
                time.sleep(1)
        config = get_recipe("llm_countdown_grpo").apply_overrides(
            [
                "policy.name=causal_lm",
                f"policy.pretrained={checkpoint}",
                "generation.engine=vllm_server",
                f"generation.engine_url={url}",
                "generation.max_new_tokens=16",
            ]
        )
        config.validate()
        served_rollout = AutoregressiveRollout(config)
        policy = full_policy(checkpoint)
        rollout.sync_weights(policy)
        colocated = sample(rollout, policy)
        served = sample(served_rollout, policy)  # the first rollout pushes the weights
        assert torch.equal(served.input_ids, colocated.input_ids)
        assert served.sampler_log_probs is not None and colocated.sampler_log_probs is not None
        served_gap = float((served.sampler_log_probs - colocated.sampler_log_probs).abs().max())
        print(f"server vs colocated log-probs: {served_gap:.3g}; health {health}")
        assert served_gap < TOLERANCE
        perturb(policy)
        seconds = served_rollout.sync_weights(policy)
        assert seconds is not None and seconds > 0
        assert log_prob_gap(served_rollout, policy, sample(served_rollout, policy)) < TOLERANCE
        bad = httpx.post(
            f"{url}/generate",
            json={
                "requests": [{"token_ids": [10**6], "n": 1, "seed": 0}],
                "settings": {"temperature": 1.0, "max_tokens": 4},
            },
        )
        assert bad.status_code == 400 and "token_ids[0]" in bad.json()["error"]
        assert httpx.get(f"{url}/health").json()["weights_version"] == 2
    finally:
        server.terminate()
        server.wait(timeout=60)


def test_rollout_engine_benchmark_quick_ends_with_its_json_line() -> None:
    command = [sys.executable, str(ROOT / "benchmarks" / "rollout_engine.py"), "--quick"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(
        [*command, "--hidden", "64", "--layers", "2"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["benchmark"] == "rollout_engine"
    (row,) = summary["configurations"]
    assert row["engine_over_loop_samples_per_s"] > 0
    assert summary["mismatch_max_abs_log_prob_diff"] < TOLERANCE
    assert summary["weight_sync_s"] > 0
