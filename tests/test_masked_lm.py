"""Masked-diffusion LMs: the unmasking sampler, the likelihood estimators and MaskGRPO / d1 on a
tiny random ModernBERT saved to disk and loaded back."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from genrl.objectives.dllm_estimators import ESTIMATORS, FadingMaskEstimator
from pipelines import build_policy
from reward_models import REWARDS, RewardModel, RewardOutput
from samplers.masked import MaskedDiffusionSampler, tokens_per_step

CHARS = list("0123456789abcdefghij .:")
MASK = 1


def save_tiny_dllm(directory: Path) -> Path:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import ModernBertConfig, ModernBertForMaskedLM, PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(["<pad>", "<mask>", "<eos>", *CHARS])}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="."))
    backend.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", mask_token="<mask>", eos_token="<eos>"
    )
    torch.manual_seed(0)
    config = ModernBertConfig(
        vocab_size=len(vocab),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        max_position_embeddings=64,
        pad_token_id=0,
        bos_token_id=2,
        eos_token_id=2,
        cls_token_id=2,
        sep_token_id=2,
        mask_token_id=1,
    )
    ModernBertForMaskedLM(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def dllm_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_dllm(tmp_path_factory.mktemp("dllm"))


# -- sampler ----------------------------------------------------------------------------------------
def test_tokens_per_step_and_block_schedule() -> None:
    assert tokens_per_step(10, 4) == [3, 3, 2, 2]
    sampler = MaskedDiffusionSampler(steps=4, block_length=4)
    assert sampler.schedule(8) == [(0, 4, 2), (0, 4, 2), (4, 8, 2), (4, 8, 2)]
    with pytest.raises(ValueError, match="multiple"):
        sampler.schedule(6)


def test_low_confidence_reveals_the_most_confident_first() -> None:
    # A model that is most sure about position 2, then 0, then 3, then 1; predicts token 7 + pos.
    confidence = torch.tensor([2.0, 0.5, 4.0, 1.0])

    def logits_fn(ids: torch.Tensor) -> torch.Tensor:
        logits = torch.zeros(ids.shape[0], ids.shape[1], 12)
        for pos in range(4):
            logits[:, 1 + pos, 7 + pos % 5] = confidence[pos]
        return logits

    out = MaskedDiffusionSampler(steps=4).generate(
        logits_fn, torch.zeros(1, 1, dtype=torch.long), 4, MASK
    )
    assert out.reveal_step.tolist() == [[1, 3, 0, 2]]
    assert out.tokens.tolist() == [[7, 8, 9, 10]]
    assert out.state_before(2, MASK).tolist() == [[7, MASK, 9, MASK]]


def test_semi_autoregressive_blocks_fill_left_to_right() -> None:
    def logits_fn(ids: torch.Tensor) -> torch.Tensor:
        logits = torch.zeros(ids.shape[0], ids.shape[1], 12)
        logits[:, -1, 5] = 9.0  # the last position is the most confident
        logits[..., 4] = 1.0
        return logits

    sampler = MaskedDiffusionSampler(steps=4, block_length=2, temperature=1.0)
    out = sampler.generate(
        logits_fn, torch.zeros(2, 3, dtype=torch.long), 4, MASK, torch.Generator().manual_seed(0)
    )
    # Block 0 (positions 0-1) is finished before block 1 starts, despite position 3's confidence.
    assert (out.reveal_step[:, :2] < 2).all() and (out.reveal_step[:, 2:] >= 2).all()


# -- estimators -------------------------------------------------------------------------------------
def _batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    prompt = torch.arange(3, 23).reshape(2, 10)
    completion = torch.arange(5, 21).reshape(2, 8)
    valid = torch.ones_like(completion, dtype=torch.bool)
    reveal = torch.tensor([[0, 1, 2, 3, 3, 2, 1, 0], [3, 2, 1, 0, 0, 1, 2, 3]])
    return prompt, completion, valid, reveal


@pytest.mark.parametrize("name", sorted(ESTIMATORS))
def test_same_seed_gives_the_same_views(name: str) -> None:
    estimator = ESTIMATORS[name]()
    first = estimator.views(*_batch(), MASK, seed=5, iteration=1, num_iterations=4)
    again = estimator.views(*_batch(), MASK, seed=5, iteration=1, num_iterations=4)
    for a, b in zip(first, again, strict=True):
        assert torch.equal(a.prompt, b.prompt) and torch.equal(a.completion, b.completion)
        assert torch.equal(a.counted, b.counted)


def test_d1_masks_the_whole_completion_and_some_prompt() -> None:
    (view,) = ESTIMATORS["d1"](prompt_mask_prob=0.5).views(*_batch(), MASK, 3, 0, 1)
    assert (view.completion == MASK).all() and view.counted.all()
    masked_prompt = view.prompt == MASK
    assert 0 < int(masked_prompt.sum()) < masked_prompt.numel()


def test_maskgrpo_ratio_schedule_and_fading_mask() -> None:
    estimator = FadingMaskEstimator(ratio_floor=0.6)
    ratios = [estimator.mask_ratio(j, 4) for j in range(4)]
    assert ratios == pytest.approx([0.7, 0.8, 0.9, 0.999])
    keep = estimator.keep_probabilities(8, 0.5)
    # Keep probability falls from the first to the last token; on average (1 - t) L are kept.
    assert (keep[1:] <= keep[:-1]).all() and float(keep.sum()) == pytest.approx(4.0)
    (view,) = estimator.views(*_batch(), MASK, seed=1, iteration=0, num_iterations=4)
    prompt, completion, _, _ = _batch()
    assert torch.equal(view.prompt, prompt)  # the prompt is never masked
    assert torch.equal(view.counted, view.completion == MASK)  # only re-masked tokens count
    assert torch.equal(view.completion[~view.counted], completion[~view.counted])


def test_maskgrpo_masks_and_counts_the_tail_after_the_end_token() -> None:
    """MaskGRPO's released code (``grpo/mask_grpo_trainer.py``: the loss mask is the re-masking
    mask, which has no end-token condition) masks positions after EOS like any other, so a view
    does not show where the answer ends; ``count_tail=False`` keeps them visible, uncounted."""
    prompt, completion, valid, reveal = _batch()
    valid[:, 3:] = False  # the answer ends at position 2 (its EOS); 3..7 are the tail
    views = {
        tail: FadingMaskEstimator(0.6, count_tail=tail).views(
            prompt, completion, valid, reveal, MASK, seed=7, iteration=3, num_iterations=4
        )[0]
        for tail in (True, False)
    }
    # Ratio 0.999: nearly everything is masked; with the tail counted, the tail is too.
    assert bool(views[True].counted[:, 3:].any())
    assert torch.equal(views[True].counted, views[True].completion == MASK)
    assert not bool(views[False].counted[:, 3:].any())
    assert torch.equal(views[False].completion[:, 3:], completion[:, 3:])


def test_trace_views_are_the_sampler_states() -> None:
    views = ESTIMATORS["trace"]().views(*_batch(), MASK, 0, 0, 1)
    _, completion, _, reveal = _batch()
    assert len(views) == 4
    counted = torch.stack([v.counted for v in views]).sum(0)
    assert (counted == 1).all()  # every token is scored exactly once
    assert torch.equal(views[2].completion, completion.masked_fill(reveal >= 2, MASK))


# -- policy and training ------------------------------------------------------------------------------
class DigitShare(RewardModel):
    """Share of digits in a completion."""

    name = "digit_share"

    def score(self, outputs, prompts, metadata):  # type: ignore[no-untyped-def]
        del prompts, metadata
        return RewardOutput(
            {self.name: torch.tensor([sum(c.isdigit() for c in t) / 8 for t in outputs])}
        )


def dllm_config(tmp_path: Path, dllm_dir: Path, algorithm: str, **changes):
    from tiny import tiny_config

    from genrl.run.config import algorithm_config

    prompts = tmp_path / "prompts.txt"
    prompts.write_text("ab 12:\ncd 34:\nef 56:\n")
    config = tiny_config(tmp_path)
    config.set_algorithm(algorithm_config(algorithm))  # generation.* exists from here on
    config.apply_overrides(
        [
            "policy.name=masked_lm",
            f"policy.pretrained={dllm_dir}",
            "reward.0.name=digit_share",
            "reward.0.kwargs={}",
            f"prompts.dataset={prompts}",
            "generation.max_new_tokens=8",
            "generation.diffusion_steps=4",
            "generation.block_length=4",
            "train.minibatch_size=16",
            "eval.samples_per_prompt=1",
        ]
    )
    for key, value in changes.items():
        setattr(config.algorithm, key, value)
    return config


@pytest.mark.parametrize(
    ("algorithm", "changes"),
    [
        ("mask_grpo", {}),
        ("mask_grpo", {"estimator": "random_ratio", "kl_beta": 0.04}),
        ("mask_grpo", {"estimator": "trace"}),
        (
            "mask_grpo",
            {
                "estimator": "d1",
                "num_iterations": 2,
                "clip_range": 0.5,
                "std_mode": "none",
                "kl_beta": 0.04,
            },
        ),
    ],
    ids=["maskgrpo", "random_ratio_kl", "trace", "d1"],
)
def test_two_steps_train_with_each_estimator(
    tmp_path: Path, dllm_dir: Path, monkeypatch, algorithm: str, changes: dict
) -> None:
    from genrl.loop.trainer import Trainer

    monkeypatch.setitem(REWARDS, "digit_share", DigitShare)
    trainer = Trainer(dllm_config(tmp_path, dllm_dir, algorithm, **changes))
    before = {n: p.detach().clone() for n, p in trainer.policy.network.named_parameters()}
    first = trainer.train_iteration()
    assert first["loss/first_minibatch_ratio_deviation"] == 0.0
    trainer.train_iteration()
    after = dict(trainer.policy.network.named_parameters())
    assert any(not torch.equal(p, after[n]) for n, p in before.items())
    assert first["loss/counted_tokens"] > 0


def test_mask_grpo_takes_mc_grpo_median_advantages(
    tmp_path: Path, dllm_dir: Path, monkeypatch
) -> None:
    """The token objective's ``advantage=median`` on a masked-diffusion LM: the pivots never
    become views, the rest train."""
    from genrl.loop.trainer import Trainer

    monkeypatch.setitem(REWARDS, "digit_share", DigitShare)
    config = dllm_config(tmp_path, dllm_dir, "mask_grpo", advantage="median", num_iterations=2)
    config.train.group_size = 3
    trainer = Trainer(config)
    batch = trainer.collect()
    assert int(batch.rollout.excluded.sum()) == 4  # one per group of 3
    kept = batch.rollout.without_excluded()
    units = trainer.objective.units(trainer.policy, kept, batch.noise)
    assert len(units) == 8 * 2  # 8 kept samples, 2 views each
    before = {n: p.detach().clone() for n, p in trainer.policy.network.named_parameters()}
    trainer.train_iteration()
    after = dict(trainer.policy.network.named_parameters())
    assert any(not torch.equal(p, after[n]) for n, p in before.items())


def test_masked_lm_loader_and_export(tmp_path: Path, dllm_dir: Path) -> None:
    from transformers import AutoModelForMaskedLM

    with pytest.raises(ValueError, match="cannot load"):
        build_policy("masked_lm", pretrained=str(tmp_path / "missing"))
    policy = build_policy("masked_lm", pretrained=str(dllm_dir))
    assert policy.mask_token_id == MASK
    policy.setup_training(0, 0, None)
    out = policy.export(tmp_path / "export")
    loaded = AutoModelForMaskedLM.from_pretrained(str(out))
    ids = torch.tensor([[3, 4, MASK, 5]])
    assert torch.allclose(
        loaded(input_ids=ids).logits, policy.network(input_ids=ids).logits, atol=1e-6
    )


def test_gumbel_sampling_follows_the_softmax() -> None:
    logits = torch.log(torch.tensor([0.1, 0.2, 0.7])).expand(20_000, 1, 3)
    sampler = MaskedDiffusionSampler(steps=1, temperature=1.0)
    tokens, confidence = sampler._predict(logits, torch.Generator().manual_seed(0))
    frequencies = torch.bincount(tokens.flatten(), minlength=3).float() / tokens.numel()
    assert torch.allclose(frequencies, torch.tensor([0.1, 0.2, 0.7]), atol=0.01)
    assert torch.allclose(confidence.flatten(), torch.tensor([0.1, 0.2, 0.7])[tokens.flatten()])
    # A higher temperature flattens the distribution.
    hot, _ = MaskedDiffusionSampler(1, temperature=4.0)._predict(
        logits, torch.Generator().manual_seed(0)
    )
    assert (hot == 2).float().mean() < 0.5


def test_llada_recipe_runs_on_a_tiny_stand_in(tmp_path: Path, dllm_dir: Path, monkeypatch) -> None:
    """LLaDA-8B's recipe (LoRA 128, 12 views, blocks, bf16, chat template, explicit mask id)
    for one iteration on the tiny model, its tokenizer given a chat template and no mask name."""
    from accelerate.state import AcceleratorState
    from transformers import AutoTokenizer

    from genrl import get_recipe
    from genrl.loop.trainer import Trainer

    tokenizer = AutoTokenizer.from_pretrained(str(dllm_dir))
    tokenizer.chat_template = (
        "{% for m in messages %}{{ m['content'] }}{% endfor %}"
        "{% if add_generation_prompt %} :{% endif %}"
    )
    tokenizer.save_pretrained(str(dllm_dir / "chat"))
    for name in ("config.json", "model.safetensors"):
        (dllm_dir / "chat" / name).write_bytes((dllm_dir / name).read_bytes())
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("ab 12\ncd 34\nef 56\n")
    monkeypatch.setitem(REWARDS, "digit_share", DigitShare)
    config = get_recipe("llada8b_countdown_maskgrpo")
    config.apply_overrides(
        [
            f"policy.pretrained={dllm_dir / 'chat'}",
            'policy.kwargs={"trust_remote_code": true, "chat_template": true, "mask_token_id": 1}',
            "policy.lora_rank=4",
            "policy.lora_target_modules=null",  # the tiny stand-in is a BERT, not LLaDA
            "reward.0.name=digit_share",
            "reward.0.kwargs={}",
            f"prompts.dataset={prompts}",
            "generation.max_new_tokens=8",
            "generation.diffusion_steps=4",
            "generation.block_length=4",
            "train.prompts_per_iteration=2",
            "train.group_size=3",
            "train.iterations=1",
            f"output_dir={tmp_path / 'run'}",
            "logging.tensorboard=false",
            "logging.progress_bar=false",
        ]
    )
    AcceleratorState._reset_state(reset_partial_state=True)
    try:
        trainer = Trainer(config)
        assert trainer.policy.format_prompts(["ab 12"]) == ["ab 12 :"]
        metrics = trainer.train_iteration()
    finally:
        AcceleratorState._reset_state(reset_partial_state=True)
    assert metrics["loss/first_minibatch_ratio_deviation"] == 0.0
    assert metrics["optimizer_steps"] == 2 * 3 * 12 // (6 * 2)  # units / (minibatch x accumulation)
    assert metrics["loss/counted_tokens"] > 0


def test_a_tokenizer_without_a_mask_token_needs_mask_token_id(
    tmp_path: Path, dllm_dir: Path
) -> None:
    from transformers import AutoModelForMaskedLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(dllm_dir))
    tokenizer.mask_token = None
    model = AutoModelForMaskedLM.from_pretrained(str(dllm_dir))
    with pytest.raises(ValueError, match="mask_token_id"):
        build_policy("masked_lm", model=model, tokenizer=tokenizer)
    assert (
        build_policy("masked_lm", model=model, tokenizer=tokenizer, mask_token_id=1).mask_token_id
        == 1
    )


def test_left_padding_does_not_move_bert_log_probs(tmp_path: Path) -> None:
    """A BERT (absolute positions) scores a prompt the same with extra left padding, as
    dynamic sampling's concatenation adds."""
    from transformers import BertConfig, BertForMaskedLM

    torch.manual_seed(0)
    config = BertConfig(vocab_size=30, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=32)  # fmt: skip
    tokenizer_dir = save_tiny_dllm(tmp_path / "tok")
    from transformers import AutoTokenizer

    policy = build_policy(
        "masked_lm", model=BertForMaskedLM(config).eval(),
        tokenizer=AutoTokenizer.from_pretrained(str(tokenizer_dir)),
    )  # fmt: skip
    ids = torch.tensor([[5, 6, 7, 1, 1, 9]])
    targets = torch.tensor([[8, 9]])
    plain = policy.token_log_probs(ids, torch.ones_like(ids), targets)
    padded_ids = torch.cat([torch.zeros(1, 2, dtype=torch.long), ids], dim=1)
    mask = torch.cat([torch.zeros(1, 2, dtype=torch.long), torch.ones_like(ids)], dim=1)
    padded = policy.token_log_probs(padded_ids, mask, targets)
    torch.testing.assert_close(padded, plain, atol=1e-5, rtol=0)


def test_d1_is_mask_grpo_with_d1s_settings() -> None:
    """diffu-GRPO is a set of MaskGRPO field values (d1's estimator, mu 12, clip 0.5, no std,
    beta 0.04), not an algorithm of its own; the recipe uses them."""
    from genrl.algorithms.mask_grpo import MaskGRPOConfig
    from genrl.recipes.registry import get_recipe

    d1 = MaskGRPOConfig.d1()
    assert (d1.name, d1.estimator, d1.num_iterations) == ("mask_grpo", "d1", 12)
    assert (d1.clip_range, d1.std_mode, d1.kl_beta) == (0.5, "none", 0.04)
    assert MaskGRPOConfig.d1(num_iterations=2).num_iterations == 2
    recipe = get_recipe("dllm_sudoku_d1").algorithm
    assert isinstance(recipe, MaskGRPOConfig) and recipe == MaskGRPOConfig.d1(num_iterations=2)


def test_the_config_names_every_estimator():
    """The views' config checks ``algorithm.estimator`` against names it reads without torch;
    they are the registered estimators."""
    from genrl.objectives.token_configs import ESTIMATOR_NAMES

    assert sorted(ESTIMATOR_NAMES) == sorted(ESTIMATORS)
