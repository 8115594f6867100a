"""aMUSEd as a masked image-token policy, and MaskGRPO on images, on a tiny random
AmusedPipeline built offline (tests/diffusers_tiny_amused.py)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from diffusers_tiny_amused import GRID, MASK_TOKEN, build_amused, tiny_amused_pipeline

from genrl.objectives.dllm_estimators import ESTIMATORS, FadingMaskEstimator
from samplers.masked_image import EmergeSampler, MaskGITSampler

PROMPTS = ["a red cube", "a blue ball on grass"]
L = GRID * GRID


@pytest.fixture(scope="module")
def amused_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_amused(tmp_path_factory.mktemp("amused"))


def _pipe():
    pipe = tiny_amused_pipeline()
    pipe.set_progress_bar_config(disable=True)
    return pipe


def _policy(pipe=None, **kwargs):
    from pipelines.diffusers.amused import AmusedPolicy

    return AmusedPolicy(pipeline=pipe if pipe is not None else _pipe(), **kwargs)


# -- the policy against the stock pipeline ------------------------------------------------------
@pytest.mark.parametrize("guidance", [10.0, 1.0], ids=["cfg", "no_cfg"])
def test_maskgit_rollout_equals_the_stock_pipeline(guidance: float) -> None:
    """Same generator seed -> the same tokens and the same decoded images as ``pipe(...)``
    (the stock temperature schedule (2, 0), 4 steps)."""
    pipe = _pipe()
    call = {"num_inference_steps": 4, "guidance_scale": guidance}
    stock = pipe(PROMPTS, generator=torch.Generator().manual_seed(3), output_type="latent", **call)
    images = pipe(PROMPTS, generator=torch.Generator().manual_seed(3), output_type="pt", **call)
    policy = _policy(pipe, guidance_scale=guidance)
    ids, mask = policy.encode_prompts(PROMPTS)
    out = policy.generate(ids, mask, MaskGITSampler(4), L, torch.Generator().manual_seed(3))
    assert torch.equal(out.tokens.reshape(2, GRID, GRID), stock.images)
    assert torch.allclose(policy.decode_images(out.tokens), images.images, atol=1e-6)
    # Every token revealed once; the cosine schedule leaves floor(64 cos(pi (s+1) / 8)) masked
    # after step s: 59, 45, 24, 0, so the steps reveal 5, 14, 21 and 24 tokens.
    counts = [(out.reveal_step == s).sum(1).tolist() for s in range(4)]
    assert counts == [[5, 5], [14, 14], [21, 21], [24, 24]]


def test_rollout_evaluation_samples_are_the_stock_pipelines() -> None:
    """``generation.sampler=maskgit`` at the stock temperatures (2 -> 0): the rollout's held-out
    images are ``pipe(...)``'s with the generator seeded as the rollout seeds it."""
    from types import SimpleNamespace

    from genrl.rollouts.configs import UnmaskingConfig
    from genrl.rollouts.masked_images import ImageUnmaskingRollout
    from genrl.rollouts.tokens import EVAL_SEED_STRIDE

    generation = UnmaskingConfig(
        sampler="maskgit", max_new_tokens=L, diffusion_steps=4, eval_temperature=2.0
    )
    generation.validate()
    rollout = ImageUnmaskingRollout(SimpleNamespace(generation=generation))
    pipe = _pipe()
    policy = _policy(pipe, guidance_scale=5.0)
    images = rollout.evaluation_outputs(policy, PROMPTS, 1, seed=7)(PROMPTS, slice(0, 2))
    generator = torch.Generator().manual_seed(7 * EVAL_SEED_STRIDE)
    stock = pipe(PROMPTS, generator=generator, output_type="pt", num_inference_steps=4,
                 guidance_scale=5.0).images  # fmt: skip
    assert torch.equal(images, stock)
    assert "MaskGIT" in rollout.evaluation_sampling()


def test_policy_defaults_and_errors() -> None:
    policy = _policy()
    assert policy.guidance_scale == 10.0  # AmusedPipeline's default
    assert (policy.height, policy.width, policy.num_image_tokens) == (32, 32, L)
    assert policy.mask_token_id == MASK_TOKEN and policy.masking_schedule == "cosine"
    ids, mask = policy.encode_prompts(PROMPTS)
    assert ids.shape == (2, 77) and bool(mask.all())
    with pytest.raises(ValueError, match="max_new_tokens must be 64"):
        policy.generate(ids, mask, MaskGITSampler(4), 32)


def test_vq_encode_is_the_nearest_codebook_entry() -> None:
    policy = _policy()
    images = torch.rand(2, 3, 32, 32)
    tokens = policy.encode_images(images)
    vq = policy.pipe.vqvae
    latents = vq.encode(images).latents.permute(0, 2, 3, 1).reshape(-1, 4)
    nearest = torch.cdist(latents, vq.quantize.embedding.weight).argmin(1)
    assert tokens.shape == (2, L) and torch.equal(tokens.reshape(-1), nearest)
    assert policy.decode_images(tokens).shape == (2, 3, 32, 32)


# -- the samplers by hand -----------------------------------------------------------------------
def test_emerge_stay_probabilities_are_the_cosine_ratios() -> None:
    """k_s / k_t with k(r) = cos(pi r / 2): cos(pi/8), cos(pi/4) / cos(pi/8),
    cos(3 pi/8) / cos(pi/4), then 0 (the last step reveals the rest)."""
    sampler = EmergeSampler(4)
    expected = [0.9238795, 0.7653669, 0.5411961, 0.0]
    assert [sampler.stay_masked(s) for s in range(4)] == pytest.approx(expected, abs=1e-6)
    assert EmergeSampler(4, schedule="linear").stay_masked(1) == pytest.approx(0.5 / 0.75)


def test_emerge_reveals_at_the_schedules_rate_and_draws_from_the_softmax() -> None:
    """On a model with fixed logits over 3 codes: the fraction revealed at step 0 is
    1 - cos(pi/8) and the revealed tokens follow softmax(logits)."""
    probs = torch.tensor([0.6, 0.3, 0.1])

    def logits_fn(ids: torch.Tensor) -> torch.Tensor:
        return probs.log().expand(ids.shape[0], 4000, 3)

    out = EmergeSampler(4).generate(
        logits_fn, torch.zeros(5, 2, dtype=torch.long), 4000, 3, torch.Generator().manual_seed(0)
    )
    first = (out.reveal_step == 0).float().mean().item()
    assert first == pytest.approx(1 - math.cos(math.pi / 8), abs=0.01)
    assert (out.reveal_step >= 0).all() and (out.tokens < 3).all()
    share = torch.bincount(out.tokens.reshape(-1), minlength=3).float() / out.tokens.numel()
    assert torch.allclose(share, probs, atol=0.01)


def test_maskgit_never_remasks_a_revealed_token() -> None:
    policy = _policy(guidance_scale=3.0)
    ids, _ = policy.encode_prompts(PROMPTS)
    states = []

    def logits_fn(x: torch.Tensor) -> torch.Tensor:
        states.append(x[:, -L:].clone())
        return policy.image_logits(x[:, -L:], policy._text(ids), guided=True)

    out = MaskGITSampler(6).generate(
        logits_fn, ids, L, MASK_TOKEN, torch.Generator().manual_seed(1)
    )
    for step, state in enumerate(states):
        assert torch.equal(state, out.state_before(step, MASK_TOKEN))


# -- the estimator and re-scoring ---------------------------------------------------------------
def test_uniform_views_by_hand() -> None:
    """MaskGRPO's image views: t_j = min(0.8 + 0.2 (j + 1) / mu, 0.999) and each image token
    masked where a seeded uniform falls below t_j (the released ``remask_t2i``)."""
    estimator = FadingMaskEstimator(ratio_floor=0.8, fading=False)
    assert [estimator.mask_ratio(j, 4) for j in range(4)] == pytest.approx([0.85, 0.9, 0.95, 0.999])
    prompt = torch.arange(6).reshape(2, 3)
    completion = torch.arange(10, 26).reshape(2, 8)
    valid = torch.ones_like(completion, dtype=torch.bool)
    (view,) = estimator.views(prompt, completion, valid, valid.long(), 99, 7, 0, 4)
    draw = torch.rand(2, 8, generator=torch.Generator().manual_seed(7))
    assert torch.equal(view.counted, draw < 0.85)
    assert torch.equal(view.completion, completion.masked_fill(draw < 0.85, 99))
    assert torch.equal(view.prompt, prompt)
    big = torch.zeros(1, 20000, dtype=torch.long)
    (wide,) = estimator.views(prompt[:1], big, big.bool() | True, big, 99, 1, 1, 4)
    assert wide.counted.float().mean().item() == pytest.approx(0.9, abs=0.01)


def test_trace_views_rescore_what_the_emerge_sampler_drew_from() -> None:
    """Rollout re-scoring consistency: with guided scoring, each token's log-prob under the
    sampler state that revealed it (TraceRL's view) is the log-softmax the sampler drew it
    from, so old log-probs are the rollout's own."""
    policy = _policy(guidance_scale=3.0, guided_scoring=True)
    ids, _ = policy.encode_prompts(PROMPTS)
    seen = []

    def logits_fn(x: torch.Tensor) -> torch.Tensor:
        logits = policy.image_logits(x[:, -L:], policy._text(ids), guided=True)
        seen.append(logits.log_softmax(-1))
        return logits

    out = EmergeSampler(4).generate(logits_fn, ids, L, MASK_TOKEN, torch.Generator().manual_seed(2))
    valid = torch.ones_like(out.tokens, dtype=torch.bool)
    views = ESTIMATORS["trace"]().views(
        ids[:, :0], out.tokens, valid, out.reveal_step, MASK_TOKEN, 0, 0, 4
    )
    assert len(views) == 4
    for step, view in enumerate(views):
        inputs = torch.cat([ids, view.completion], 1)
        with torch.no_grad():
            scored = policy.token_log_probs(inputs, torch.ones_like(inputs), out.tokens)
        drawn = seen[step].gather(-1, out.tokens.unsqueeze(-1)).squeeze(-1)
        assert torch.allclose(scored[view.counted], drawn[view.counted], atol=1e-5)


# -- MaskGRPO on images -------------------------------------------------------------------------
def amused_config(tmp_path: Path, amused_dir: Path, sampler: str, **changes):
    from tiny import tiny_config

    from genrl.run.config import algorithm_config

    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a red square\na green field\na red car\n")
    config = tiny_config(tmp_path)
    config.set_algorithm(algorithm_config("mask_grpo"))
    config.apply_overrides(
        [
            "policy.name=amused",
            f"policy.pretrained={amused_dir}",
            'policy.kwargs={"guidance_scale": 3.0}',
            "reward.0.name=target_color",
            "reward.0.kwargs={}",
            f"prompts.dataset={prompts}",
            f"generation.sampler={sampler}",
            f"generation.max_new_tokens={L}",
            "generation.diffusion_steps=4",
            "generation.temperature=1.0",
            "generation.eval_temperature=1.0",
            "algorithm.view_masking=uniform",
            "algorithm.mask_ratio_floor=0.8",
            "algorithm.num_iterations=2",
            "train.minibatch_size=16",
            "eval.samples_per_prompt=1",
        ]
    )
    for key, value in changes.items():
        setattr(config.algorithm, key, value)
    return config


@pytest.mark.parametrize(
    ("sampler", "changes"),
    [
        ("emerge", {}),
        ("maskgit", {"estimator": "d1", "clip_range": 0.5, "std_mode": "none", "kl_beta": 0.04}),
    ],
    ids=["maskgrpo_emerge", "d1_maskgit"],
)
def test_two_steps_of_mask_grpo_train_the_image_policy(
    tmp_path: Path, amused_dir: Path, sampler: str, changes: dict
) -> None:
    from genrl.loop.trainer import Trainer
    from genrl.rollouts.masked_images import ImageUnmaskingRollout

    trainer = Trainer(amused_config(tmp_path, amused_dir, sampler, **changes))
    assert isinstance(trainer.rollout, ImageUnmaskingRollout)
    before = {n: p.detach().clone() for n, p in trainer.policy.network.named_parameters()}
    first = trainer.train_iteration()
    assert first["loss/first_minibatch_ratio_deviation"] == 0.0
    assert first["loss/counted_tokens"] > 0
    trainer.train_iteration()
    after = dict(trainer.policy.network.named_parameters())
    assert any(not torch.equal(p, after[n]) for n, p in before.items())


def test_views_keep_the_clip_prompt_and_count_the_masked_image_tokens(
    tmp_path: Path, amused_dir: Path
) -> None:
    """d1 on images: every image token masked and counted, the CLIP prompt whole (it has no
    mask token); MaskGRPO's views: the masked ones counted, old log-probs those of the view."""
    from genrl.loop.trainer import Trainer

    config = amused_config(tmp_path, amused_dir, "emerge", estimator="d1", kl_beta=0.0)
    config.train.inner_epochs = 2  # old log-probs are scored when the iteration updates twice
    trainer = Trainer(config)
    batch = trainer.collect()
    units = trainer.objective.units(trainer.policy, batch.rollout, batch.noise)
    n = len(batch.rollout)
    assert torch.equal(
        units.inputs[:, :77], batch.rollout.prompt_ids.repeat_interleave(2, 0)[:, :77]
    )
    assert (units.inputs[:, 77:] == MASK_TOKEN).all() and units.counted.all()
    trainer.objective.views.estimator = "maskgrpo"
    trainer.objective.estimator = trainer.objective.views.make_estimator()
    units = trainer.objective.units(trainer.policy, batch.rollout, batch.noise)
    masked = units.inputs[:, 77:] == MASK_TOKEN
    assert torch.equal(units.counted, masked) and len(units) == 2 * n
    with torch.no_grad():
        log_probs = trainer.policy.token_log_probs(
            units.inputs, units.attention_mask, units.targets
        )
    assert torch.allclose(units.old_log_probs, log_probs * masked, atol=1e-6)


def test_image_generation_settings_are_checked_at_build(tmp_path: Path, amused_dir: Path) -> None:
    from genrl.config.errors import ConfigError
    from genrl.loop.trainer import Trainer

    config = amused_config(tmp_path, amused_dir, "emerge")
    config.generation.sampler = "llada"
    config.generation.diffusion_steps = 0
    with pytest.raises(
        ConfigError, match="masked image-token models sample with maskgit or emerge"
    ):
        Trainer(config)
    config = amused_config(tmp_path, amused_dir, "emerge")
    config.generation.max_new_tokens = 48
    with pytest.raises(ConfigError, match=r"generation\.max_new_tokens must be 64"):
        Trainer(config)


def test_lora_export_loads_into_the_stock_pipeline(tmp_path: Path, amused_dir: Path) -> None:
    """A trained (here: randomised) LoRA, exported, loads with ``load_lora_adapter`` into a
    freshly loaded stock pipeline, which then samples the policy's tokens."""
    from diffusers import AmusedPipeline

    from pipelines import build_policy

    policy = build_policy("amused", pretrained=str(amused_dir), guidance_scale=3.0)
    policy.setup_training(4, 8.0, None)
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in policy.network.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    policy.export(tmp_path / "export")
    ids, mask = policy.encode_prompts(PROMPTS)
    ours = policy.generate(ids, mask, MaskGITSampler(4), L, torch.Generator().manual_seed(5))
    pipe = AmusedPipeline.from_pretrained(amused_dir)
    pipe.set_progress_bar_config(disable=True)
    base = pipe(PROMPTS, generator=torch.Generator().manual_seed(5), output_type="latent",
                num_inference_steps=4, guidance_scale=3.0).images  # fmt: skip
    pipe.transformer.load_lora_adapter(str(tmp_path / "export"), prefix=None, use_safetensors=True)
    stock = pipe(PROMPTS, generator=torch.Generator().manual_seed(5), output_type="latent",
                 num_inference_steps=4, guidance_scale=3.0).images  # fmt: skip
    assert not torch.equal(base, stock)  # the adapter changes the samples
    assert torch.equal(ours.tokens.reshape(2, GRID, GRID), stock)


def test_amused_recipe_runs_on_the_tiny_stand_in(tmp_path: Path, amused_dir: Path) -> None:
    """aMUSEd-256's recipe (LoRA 128, emerge sampler, 6 uniform views, bf16, CFG 4) for one
    iteration on the tiny pipeline (64 image tokens instead of 256)."""
    from accelerate.state import AcceleratorState

    from genrl import get_recipe
    from genrl.loop.trainer import Trainer

    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a red square\na green field\n")
    config = get_recipe("amused256_maskgrpo_hps")
    config.apply_overrides(
        [
            f"policy.pretrained={amused_dir}",
            "policy.lora_rank=4",
            "reward.0.name=target_color",
            "reward.0.kwargs={}",
            f"prompts.dataset={prompts}",
            f"generation.max_new_tokens={L}",
            "generation.diffusion_steps=4",
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
        assert trainer.policy.guidance_scale == 4.0
        metrics = trainer.train_iteration()
    finally:
        AcceleratorState._reset_state(reset_partial_state=True)
    assert metrics["loss/first_minibatch_ratio_deviation"] == 0.0
    assert metrics["optimizer_steps"] == 2 * 3 * 6 // (3 * 3)  # units / (minibatch x accumulation)
