"""The rollout-engine contract of token policies (genrl/rollouts/engines): the registry, its
config errors, the default loop engine, the mismatch metrics with truncated importance sampling,
and the merged weights an engine loads. vLLM itself is tested in its own lane
(tests/test_vllm_engine.py)."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest
import torch

from genrl import get_recipe
from genrl.config.errors import ConfigError
from genrl.data.batches import TokenRollout
from genrl.data.rng import RolloutNoise, Streams
from genrl.objectives.losses import TokenClippedSurrogate, token_policy_loss
from genrl.objectives.mismatch import sampler_mismatch
from genrl.rollouts import engines
from genrl.rollouts.engines.loop import LoopEngine
from genrl.rollouts.tokens import AutoregressiveRollout
from pipelines import build_policy
from tests.engine_tiny import save_engine_lm


def test_the_registry_builds_the_loop_by_default() -> None:
    config = get_recipe("llm_countdown_grpo")
    assert config.generation.engine == "loop"
    assert set(engines.ENGINES) == {"loop", "vllm", "vllm_server"}
    assert isinstance(AutoregressiveRollout(config).engine, LoopEngine)


def test_an_unknown_engine_names_the_near_one() -> None:
    config = get_recipe("llm_countdown_grpo").apply_overrides(["generation.engine=vlm"])
    with pytest.raises(ConfigError, match=r"generation.engine: unknown name 'vlm'.*'vllm'"):
        config.validate()


def test_vllm_without_vllm_installed_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        engines.importlib.util,
        "find_spec",
        lambda name, *a: None if name == "vllm" else real(name, *a),
    )
    config = get_recipe("llm_countdown_grpo").apply_overrides(["generation.engine=vllm"])
    with pytest.raises(ConfigError) as error:
        config.validate()
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith("generation.engine=vllm needs the vllm package")
    assert ".ci/vllm_lane" in message


@pytest.mark.parametrize(
    ("override", "field"),
    [("generation.engine_kv_cache_mb=0", "engine_kv_cache_mb"), ("algorithm.tis_cap=0", "tis_cap")],
)
def test_engine_and_correction_fields_are_checked(override: str, field: str) -> None:
    config = get_recipe("llm_countdown_grpo").apply_overrides([override])
    with pytest.raises(ConfigError, match=field):
        config.validate()


def test_the_loop_engine_records_log_probs_training_recomputes() -> None:
    """The default engine samples what the policy's own loop samples from the token stream,
    and its log-probs are the cached forward's: equal to the full forward's up to rounding."""
    config = get_recipe("llm_countdown_grpo")
    policy = build_policy("countdown_lm")
    rollout = AutoregressiveRollout(config)
    prompts = ["3 5 7 = 15 :"] * 4 + ["2 4 6 = 12 :"] * 4
    noise = RolloutNoise(0, 0, len(prompts), slice(0, len(prompts)))
    batch = rollout.collect(policy, prompts, torch.arange(8) // 4, noise)
    ids, mask = policy.encode_prompts(prompts)
    expected = policy.generate(
        ids,
        mask,
        rollout.sampler,
        config.generation.max_new_tokens,
        noise.device_generator(Streams.TOKEN_SAMPLING, policy.device),
    )
    assert torch.equal(batch.input_ids[:, batch.completion_start :], expected.tokens)
    assert batch.sampler_log_probs is not None
    counted = batch.completion_mask
    recomputed = policy.token_log_probs(
        batch.input_ids, batch.attention_mask, batch.input_ids[:, batch.completion_start :]
    )
    difference = (recomputed - batch.sampler_log_probs)[counted].abs().max()
    assert 0 <= float(difference) < 1e-4
    assert bool((batch.sampler_log_probs[~counted] == 0).all())


def test_mismatch_metrics_and_truncated_weights_by_hand() -> None:
    trainer = torch.tensor([[-1.0, -2.0, -0.5], [-0.1, -3.0, 0.0]])
    sampler = torch.tensor([[-1.0, -3.0, -0.5], [-0.2, -1.0, 0.0]])
    mask = torch.tensor([[True, True, False], [True, True, False]])
    weights, metrics = sampler_mismatch(trainer, sampler, mask, cap=2.0)
    ratios = torch.tensor([1.0, math.e, math.exp(0.1), math.exp(-2.0)])
    assert weights is not None
    expected = torch.tensor([[1.0, 2.0, 0.0], [math.exp(0.1), math.exp(-2.0), 0.0]])
    torch.testing.assert_close(weights, expected)
    k3 = (ratios - 1 - ratios.log()).mean()
    torch.testing.assert_close(metrics["mismatch_kl"], k3)
    torch.testing.assert_close(metrics["mismatch_ratio_max"], torch.tensor(math.e))
    torch.testing.assert_close(metrics["mismatch_ratio_min"], torch.tensor(math.exp(-2.0)))
    torch.testing.assert_close(metrics["mismatch_max_abs_diff"], torch.tensor(2.0))
    assert float(metrics["tis_truncated_fraction"]) == 0.25
    none, untruncated = sampler_mismatch(trainer, sampler, mask)
    assert none is None and "tis_truncated_fraction" not in untruncated


def test_truncated_weights_scale_each_token_term() -> None:
    """With weights, the surrogate is the weighted token mean of the unweighted per-token terms
    (a one-token sequence each, so sequence_mean is that token's term)."""
    surrogate = TokenClippedSurrogate(0.2, aggregation="sequence_mean")
    log_probs = torch.tensor([[-1.0], [-2.0]], requires_grad=True)
    old = torch.tensor([[-1.1], [-1.9]])
    advantages = torch.tensor([1.0, -1.0])
    mask = torch.ones(2, 1, dtype=torch.bool)
    weights = torch.tensor([[0.5], [2.0]])
    plain = [
        token_policy_loss(
            surrogate,
            log_probs[i : i + 1],
            old[i : i + 1],
            old[:1, :0],
            advantages[i : i + 1],
            mask[:1],
        )[0]
        for i in range(2)
    ]
    weighted, _ = token_policy_loss(
        surrogate, log_probs, old, old[:, :0], advantages, mask, token_weights=weights
    )
    torch.testing.assert_close(weighted, (0.5 * plain[0] + 2.0 * plain[1]) / 2)


def test_the_rollout_keeps_engine_log_probs_through_concatenation() -> None:
    def batch(width: int) -> TokenRollout:
        return TokenRollout(
            prompts=["a"],
            completions=["b"],
            group_ids=torch.zeros(1, dtype=torch.long),
            input_ids=torch.ones(1, 2 + width, dtype=torch.long),
            attention_mask=torch.ones(1, 2 + width, dtype=torch.long),
            completion_mask=torch.ones(1, width, dtype=torch.bool),
            old_log_probs=torch.zeros(1, 0),
            ref_log_probs=torch.zeros(1, 0),
            finished=torch.ones(1, dtype=torch.bool),
            advantages=torch.zeros(1),
            sampler_log_probs=-torch.ones(1, width),
        )

    joined = TokenRollout.concatenate([batch(2), batch(3)])
    assert joined.sampler_log_probs is not None
    assert joined.sampler_log_probs.tolist() == [[-1.0, -1.0, 0.0], [-1.0, -1.0, -1.0]]
    assert joined.select(torch.tensor([1])).sampler_log_probs.tolist() == [[-1.0, -1.0, -1.0]]


@pytest.mark.parametrize("lora", [False, True])
def test_engine_weights_rebuild_the_policy_model(tmp_path: Path, lora: bool) -> None:
    """What an engine loads (every weight, a LoRA adapter merged in) makes a fresh copy of the
    checkpoint compute the policy's own logits; the policy itself is left as it was."""
    from transformers import AutoModelForCausalLM

    directory = save_engine_lm(tmp_path / "lm")
    policy = build_policy("causal_lm", pretrained=str(directory))
    assert policy.checkpoint == str(directory)
    policy.setup_training(4 if lora else 0, 0.0, None)
    with torch.no_grad():
        for name, parameter in policy.network.named_parameters():
            if parameter.requires_grad:  # an update, so that the merge has something to merge
                parameter.add_(0.05 * torch.randn_like(parameter))
                assert not lora or "lora_" in name
    ids = torch.tensor([[13, 3, 15, 3, 17, 3, 2, 3, 11]])
    before = {n: p.clone() for n, p in policy.network.named_parameters()}
    weights = dict(policy.engine_weights())
    assert all(torch.equal(before[n], p) for n, p in policy.network.named_parameters())
    fresh = AutoModelForCausalLM.from_pretrained(directory)
    fresh.load_state_dict(weights, strict=True)  # every weight, the tied head's included
    with torch.no_grad():
        expected = policy.network(input_ids=ids).logits
        fresh_logits = fresh(input_ids=ids).logits
        original = AutoModelForCausalLM.from_pretrained(directory)(input_ids=ids).logits
    torch.testing.assert_close(fresh_logits, expected, atol=1e-5, rtol=1e-5)
    assert float((original - expected).abs().max()) > 1e-3  # the update did change the model


def test_vllm_on_the_cpu_refuses_heads_below_its_kernel(tmp_path: Path) -> None:
    """Heads 24 wide (the Countdown LM shipped until 2026-12-03) fail vLLM's CPU attention: one
    sentence that says so, before vLLM is imported (so it holds in either virtualenv)."""
    from genrl.rollouts.engines.vllm_engine import VLLMEngine

    config = get_recipe("llm_countdown_grpo")
    policy = build_policy("causal_lm", pretrained=str(save_engine_lm(tmp_path / "lm", head_dim=24)))
    prompts = ["3 5 7 = 15 :"]
    ids, mask = policy.encode_prompts(prompts)
    noise = RolloutNoise(0, 0, 1, slice(0, 1))
    sampler = AutoregressiveRollout(config).sampler
    with pytest.raises(ConfigError, match=r"at least 32 dimensions.*has 24"):
        VLLMEngine(config).generate(policy, ids, mask, sampler, 8, noise, {})
