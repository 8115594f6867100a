"""The causal-LM adapter and GRPO on a tiny random Qwen3 saved to disk and loaded back."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

import pytest
import torch

from genrl.algorithms.grpo import GRPOConfig
from genrl.run.config import (
    EvalConfig,
    GenerationConfig,
    LoggingConfig,
    OptimConfig,
    PolicyConfig,
    PromptConfig,
    RewardSpec,
    TrainConfig,
    TrainLoopConfig,
)
from pipelines import build_policy
from reward_models import REWARDS, RewardModel, RewardOutput
from samplers.autoregressive import TokenSampler

CHARS = list("abcdefghijklmnopqrstuvwxyz0123456789 +-*/=().,?")


def save_tiny_lm(directory: Path) -> Path:
    """A 2-layer Qwen3 with a character-level tokenizer, saved like a hub checkpoint."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

    vocab = {t: i for i, t in enumerate(["<pad>", "<eos>", *CHARS])}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="?"))
    backend.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", eos_token="<eos>"
    )
    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=len(vocab),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        max_position_embeddings=128,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=None,
        tie_word_embeddings=True,
    )
    Qwen3ForCausalLM(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def lm_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_lm(tmp_path_factory.mktemp("lm"))


class CountLetterA(RewardModel):
    """Share of the letter 'a' in a completion: a reward a tiny random LM can learn."""

    name = "letter_a"
    seen_metadata: ClassVar[list] = []

    def score(self, outputs, prompts, metadata):  # type: ignore[no-untyped-def]
        del prompts
        CountLetterA.seen_metadata.append(metadata)
        values = [t.count("a") / max(len(t), 1) for t in outputs]
        return RewardOutput({self.name: torch.tensor(values)})


def lm_config(tmp_path: Path, lm_dir: Path, **algorithm) -> TrainConfig:
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("say a\nsay b\nwrite 12\nwrite 3+4\n")
    return TrainConfig(
        recipe="tiny_lm",
        output_dir=str(tmp_path / "run"),
        policy=PolicyConfig(name="causal_lm", pretrained=str(lm_dir), lora_rank=4),
        generation=GenerationConfig(max_new_tokens=8, temperature=1.0),
        reward=[RewardSpec(name="letter_a")],
        algorithm=GRPOConfig(**algorithm),
        prompts=PromptConfig(dataset=str(prompts)),
        train=TrainLoopConfig(
            iterations=2, prompts_per_iteration=2, group_size=4, minibatch_size=4
        ),
        optim=OptimConfig(lr=5e-2),
        eval=EvalConfig(samples_per_prompt=1, batch_size=4),
        logging=LoggingConfig(tensorboard=False, progress_bar=False, log_every=1000),
    )


def test_generation_log_probs_match_a_full_forward(lm_dir: Path) -> None:
    policy = build_policy("causal_lm", pretrained=str(lm_dir))
    ids, mask = policy.encode_prompts(["say a", "write 3+4 now"])
    assert ids.shape[0] == 2 and bool((mask[0, 0] == 0) & (mask[1, 0] == 1))  # left padding
    sampler = TokenSampler(temperature=1.0)
    out = policy.generate(ids, mask, sampler, 6, torch.Generator().manual_seed(0))
    full_ids = torch.cat([ids, out.tokens], 1)
    attention = torch.cat([mask, out.mask.long()], 1)
    rescored = policy.token_log_probs(full_ids, attention, out.tokens, sampler.temperature)
    # Cached incremental decoding and one full forward agree up to float rounding.
    assert torch.allclose(rescored * out.mask, out.log_probs, atol=1e-5)
    finished_rows = out.finished.nonzero().flatten().tolist()
    for row in finished_rows:  # the end token is kept and nothing after it is trained
        last = int(out.mask[row].sum()) - 1
        assert int(out.tokens[row, last]) in policy.eos_token_ids


@pytest.mark.parametrize("max_prompt_length", [None, 6])
def test_repeated_prompts_are_tokenized_once(lm_dir: Path, max_prompt_length: int | None) -> None:
    """A rollout batch repeats each prompt ``group_size`` times: each distinct prompt is
    tokenized once and its row repeated, with exactly the ids and mask of tokenizing all."""
    policy = build_policy("causal_lm", pretrained=str(lm_dir), max_prompt_length=max_prompt_length)
    prompts = ["write 3+4", "say a", "write 3+4", "say a", "a", "write 3+4 now", "a"]
    tok = policy.tokenizer
    seen: list[list[str]] = []
    calls = tok.__class__.__call__

    def counted(self, text, *args, **kwargs):  # type: ignore[no-untyped-def]
        seen.append(list(text))
        return calls(self, text, *args, **kwargs)

    tok.padding_side, tok.truncation_side = "left", "left"
    expected = calls(
        tok,
        prompts,
        return_tensors="pt",
        padding=True,
        truncation=max_prompt_length is not None,
        max_length=max_prompt_length,
    )
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(tok.__class__, "__call__", counted)
        ids, mask = policy.encode_prompts(prompts)
    assert seen == [["write 3+4", "say a", "a", "write 3+4 now"]]
    assert torch.equal(ids, expected["input_ids"])
    assert torch.equal(mask, expected["attention_mask"])


def test_decode_keeps_the_masked_tokens_without_special_ones(lm_dir: Path) -> None:
    policy = build_policy("causal_lm", pretrained=str(lm_dir))
    tok = policy.tokenizer
    rows = ("ab=cd", "x+1yz", "hello")
    ids = torch.tensor([[tok.convert_tokens_to_ids(c) for c in t] for t in rows])
    ids[2, 3] = tok.eos_token_id  # special tokens are dropped
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 0, 1, 1, 0], [1, 1, 1, 1, 1]], dtype=torch.bool)
    decoded = policy.decode(ids, mask)
    # This word-level tokenizer joins tokens with spaces.
    assert [text.replace(" ", "") for text in decoded] == ["ab=", "x1y", "helo"]
    assert decoded == tok.batch_decode(
        [t[m].tolist() for t, m in zip(ids, mask, strict=True)], skip_special_tokens=True
    )
    assert policy.decode(ids[:0], mask[:0]) == []


def test_stop_strings_cut_the_trained_tokens(lm_dir: Path) -> None:
    policy = build_policy("causal_lm", pretrained=str(lm_dir))
    ids = torch.tensor([[policy.tokenizer.convert_tokens_to_ids(c) for c in "ab=cd"]])
    mask = torch.ones_like(ids, dtype=torch.bool)
    cut = policy.cut_at_stop_strings(ids, mask, ["="])
    assert cut.tolist() == [[True, True, True, False, False]]
    # Longer rows (the cut is found by bisection); a row without a stop string stays whole.
    rows = ("abc=defgh", "abcdefgh=", "abcdefghi")
    ids = torch.tensor([[policy.tokenizer.convert_tokens_to_ids(c) for c in t] for t in rows])
    cut = policy.cut_at_stop_strings(ids, torch.ones_like(ids, dtype=torch.bool), ["=", "zz"])
    assert cut.sum(1).tolist() == [4, 9, 9]


@pytest.mark.parametrize(
    "variant",
    [
        {},
        {"ratio_level": "sequence", "clip_range": 3e-4, "clip_range_high": 4e-4},
        {"aggregation": "token_mean", "clip_range_high": 0.28, "kl_beta": 0.04},
        {"advantage": "rloo", "aggregation": "constant", "std_mode": "none"},
    ],
    ids=["grpo", "gspo", "dapo_kl", "rloo_drgrpo"],
)
def test_two_grpo_steps_train(tmp_path: Path, lm_dir: Path, monkeypatch, variant: dict) -> None:
    from genrl.loop.trainer import Trainer

    monkeypatch.setitem(REWARDS, "letter_a", CountLetterA)
    trainer = Trainer(lm_config(tmp_path, lm_dir, **variant))
    params = {
        n: p.detach().clone()
        for n, p in trainer.policy.network.named_parameters()
        if p.requires_grad
    }
    first = trainer.train_iteration()
    assert first["loss/first_minibatch_ratio_deviation"] == 0.0
    trainer.train_iteration()
    after = dict(trainer.policy.network.named_parameters())
    changed = [n for n, p in params.items() if not torch.equal(p, after[n])]
    assert len(changed) >= 0.9 * len(params)
    if variant.get("kl_beta"):
        assert "loss/kl" in first
    # Rollout rewards see the completion lengths (TRL's extra columns).
    assert any(m and "completion_length" in m[0] for m in CountLetterA.seen_metadata)


def test_full_fine_tune_and_export_round_trip(tmp_path: Path, lm_dir: Path, monkeypatch) -> None:
    from transformers import AutoModelForCausalLM

    from genrl.loop.trainer import Trainer

    monkeypatch.setitem(REWARDS, "letter_a", CountLetterA)
    config = lm_config(tmp_path, lm_dir)
    config.policy.lora_rank = 0
    trainer = Trainer(config)
    trainer.train_iteration()
    out = trainer.export(tmp_path / "export")
    loaded = AutoModelForCausalLM.from_pretrained(str(out))
    ids = torch.tensor([[3, 4, 5, 6]])
    ours = trainer.policy.network(input_ids=ids).logits
    assert torch.allclose(loaded(input_ids=ids).logits, ours, atol=1e-6)
    base = AutoModelForCausalLM.from_pretrained(str(lm_dir))
    assert not torch.allclose(base(input_ids=ids).logits, ours, atol=1e-6)


def test_lora_export_loads_with_peft(tmp_path: Path, lm_dir: Path, monkeypatch) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from genrl.loop.trainer import Trainer

    monkeypatch.setitem(REWARDS, "letter_a", CountLetterA)
    trainer = Trainer(lm_config(tmp_path, lm_dir))
    trainer.train_iteration()
    out = trainer.export(tmp_path / "export")
    loaded = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(str(lm_dir)), str(out))
    ids = torch.tensor([[3, 4, 5, 6]])
    ours = trainer.policy.network(input_ids=ids).logits
    assert torch.allclose(loaded(input_ids=ids).logits, ours, atol=1e-6)
    with trainer.policy.reference():  # adapter disabled = the base model
        base = AutoModelForCausalLM.from_pretrained(str(lm_dir))(input_ids=ids).logits
        assert torch.allclose(trainer.policy.network(input_ids=ids).logits, base, atol=1e-6)


def test_text_evaluation_and_report(tmp_path: Path, lm_dir: Path, monkeypatch) -> None:
    from genrl.loop.trainer import Trainer

    monkeypatch.setitem(REWARDS, "letter_a", CountLetterA)
    config = lm_config(tmp_path, lm_dir)
    config.train.iterations = 1
    summary = Trainer(config).train()
    run = Path(config.output_dir)
    assert (run / "samples_before.md").is_file() and (run / "samples_after.md").is_file()
    assert summary["heldout_samples"] == 4
    # Greedy held-out decoding is deterministic: untrained weights score what the run scored
    # before training, the run's checkpoint what it scored after, and training changed them.
    from genrl.checkpoints.checkpoint import resolve_checkpoint

    untrained = Trainer(config)
    before = untrained.evaluate()
    assert before.outputs == untrained.evaluate().outputs
    assert before.reward == pytest.approx(summary["heldout_reward_before"], abs=1e-6)
    trained = Trainer(config)
    trained.load_checkpoint(resolve_checkpoint(run))
    after = trained.evaluate()
    assert after.reward == pytest.approx(summary["heldout_reward_after"], abs=1e-6)
    assert after.outputs != before.outputs


def test_bad_settings_are_rejected(tmp_path: Path, lm_dir: Path, monkeypatch) -> None:
    from genrl.config.errors import ConfigError

    monkeypatch.setitem(REWARDS, "letter_a", CountLetterA)
    config = lm_config(tmp_path, lm_dir)
    config.generation.temperature = 0.0
    with pytest.raises(ConfigError, match="temperature"):
        config.validate()
    config = lm_config(tmp_path, lm_dir)
    config.train.group_size = 1
    with pytest.raises(ConfigError, match="group_size"):
        config.validate()
    with pytest.raises(ValueError, match="cannot load"):
        build_policy("causal_lm", pretrained=str(tmp_path / "missing"))


def test_dapo_token_mean_spans_the_accumulation_window(
    tmp_path: Path, lm_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DAPO's token mean (TRL ``loss_type="dapo"``: token sum / tokens of the whole step over
    all processes): two accumulated minibatches of 4 completions take the same gradient as one
    minibatch of 8, whatever their token counts; the per-minibatch mean (``bnpo``) does not."""
    from genrl import Trainer

    monkeypatch.setitem(REWARDS, "letter_a", CountLetterA)
    norms = {}
    for aggregation in ("token_mean", "bnpo"):
        for size, accumulate in ((4, 2), (8, 1)):
            config = lm_config(tmp_path, lm_dir, aggregation=aggregation)
            config.train.minibatch_size, config.train.gradient_accumulation_steps = size, accumulate
            config.optim.max_grad_norm = None
            config.output_dir = str(tmp_path / f"{aggregation}-{size}")
            trainer = Trainer(config)
            norms[aggregation, size] = trainer.train_iteration()["grad_norm"]
    assert norms["token_mean", 4] == pytest.approx(norms["token_mean", 8], rel=1e-4)
    assert norms["bnpo", 4] != pytest.approx(norms["bnpo", 8], rel=1e-3)


def test_one_step_iterations_skip_the_old_log_prob_forward(
    tmp_path: Path, lm_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With one pass and every minibatch in one optimizer step the loss sees the parameters that
    sampled, so the old log-probs are training's own, detached (TRL skips them likewise): one
    scoring forward fewer per rollout, and the same update as with the recorded ones."""
    import genrl.objectives.tokens as tokens_module
    from genrl import Trainer

    monkeypatch.setitem(REWARDS, "letter_a", CountLetterA)
    results = {}
    for skip in (True, False):
        config = lm_config(tmp_path, lm_dir)
        config.train.minibatch_size, config.train.gradient_accumulation_steps = 4, 2  # 8 samples
        config.output_dir = str(tmp_path / f"skip-{skip}")
        monkeypatch.setattr(tokens_module, "updates_once", lambda *_, s=skip: s)
        trainer = Trainer(config)
        calls = {"n": 0}
        score = trainer.policy.token_log_probs

        def counted(*args, calls=calls, score=score, **kwargs):  # type: ignore[no-untyped-def]
            calls["n"] += 1
            return score(*args, **kwargs)

        trainer.policy.token_log_probs = counted  # type: ignore[method-assign]
        batch = trainer.collect()
        assert calls["n"] == 0  # the rollout samples; scoring is the objective's
        units = trainer.objective.units(trainer.policy, batch.rollout, batch.noise)
        assert units.old_log_probs.shape[1] == (0 if skip else 8)
        scored = calls["n"]
        metrics = trainer.updater.update(trainer.objective, units, batch.noise)
        results[skip] = (scored, metrics["grad_norm"], trainer.optimizer_steps)
    assert results[True][0] == 0 and results[False][0] >= 1
    assert results[True][2] == results[False][2] == 1
    assert results[True][1] == pytest.approx(results[False][1], rel=1e-5)
    # The rule itself: one pass, all minibatches in one step.
    from genrl.objectives.base import updates_once

    config = lm_config(tmp_path, lm_dir)
    assert not updates_once(config, 8)  # 2 minibatches of 4, one per step
    config.train.gradient_accumulation_steps = 2
    assert updates_once(config, 8)
    config.train.inner_epochs = 2
    assert not updates_once(config, 8)


def test_mc_grpo_trains_without_the_median_samples(
    tmp_path: Path, lm_dir: Path, monkeypatch
) -> None:
    """``advantage=median`` with groups of G + 1 = 3: each group's median completion has
    advantage 0 and is not a training unit; the other two train."""
    from genrl.config.errors import ConfigError
    from genrl.loop.trainer import Trainer
    from genrl.objectives.advantages import median_centered_advantages

    monkeypatch.setitem(REWARDS, "letter_a", CountLetterA)
    config = lm_config(tmp_path, lm_dir, advantage="median")
    with pytest.raises(ConfigError, match=r"odd train\.group_size"):
        config.validate()
    config.train.group_size = 3
    trainer = Trainer(config)
    params = {n: p.detach().clone() for n, p in trainer.policy.network.named_parameters()}
    batch = trainer.collect()
    rewards = batch.scores["letter_a"]
    expected, pivots = median_centered_advantages(rewards, batch.group_ids)
    torch.testing.assert_close(batch.rollout.advantages, expected)
    assert torch.equal(batch.rollout.excluded, pivots) and int(pivots.sum()) == 2
    kept = batch.rollout.without_excluded()
    assert kept.completions == [
        c for c, p in zip(batch.rollout.completions, pivots, strict=True) if not p
    ]
    seen: list[int] = []
    units = trainer.objective.units

    def recording(policy, rollout, noise):  # type: ignore[no-untyped-def]
        seen.append(len(rollout))
        return units(policy, rollout, noise)

    monkeypatch.setattr(trainer.objective, "units", recording)
    trainer.train_iteration()
    trainer.train_iteration()
    assert seen == [4, 4]  # 2 groups of 3, less their pivots
    after = dict(trainer.policy.network.named_parameters())
    assert any(not torch.equal(p, after[n]) for n, p in params.items())
