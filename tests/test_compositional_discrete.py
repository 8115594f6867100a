"""The compositional task's discrete track: the embedded aMUSEd pipeline
(``genrl/assets/compositional_discrete``, built by ``scripts/build_discrete_assets.py``) and its
MaskGRPO recipe."""

from __future__ import annotations

import hashlib
import json
import random
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
ASSET_DIR = REPO / "genrl" / "assets" / "compositional_discrete"


@pytest.fixture(scope="module")
def build_script():
    """``scripts/build_discrete_assets.py`` as a module."""
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        import build_discrete_assets
    finally:
        sys.path.remove(str(REPO / "scripts"))
    return build_discrete_assets


def test_manifest_matches_shipped_files() -> None:
    manifest = json.loads((ASSET_DIR / "manifest.json").read_text())
    shipped = {
        p.relative_to(ASSET_DIR).as_posix()
        for p in ASSET_DIR.rglob("*")
        if p.is_file() and p.name != "manifest.json"
    }
    assert set(manifest["files"]) == shipped
    for name, entry in manifest["files"].items():
        data = (ASSET_DIR / name).read_bytes()
        assert hashlib.sha256(data).hexdigest() == entry["sha256"], name
        assert len(data) == entry["size_bytes"], name
    assert sum(e["size_bytes"] for e in manifest["files"].values()) < 5_000_000
    assert {"model_index.json", "vqvae/config.json", "transformer/config.json"} <= shipped


def test_shipped_pipeline_loads_through_the_adapter_and_decodes_scenes() -> None:
    """``policy.name=compositional_discrete`` is the ``amused`` adapter on the shipped folder:
    8x8 tokens of 32x32 images, and decode(encode(x)) of rendered scenes of held-out prompts
    still reads as correct to the compositional scorer."""
    from pipelines import build_policy
    from pipelines.diffusers.amused import AmusedPolicy
    from reward_models.compositional import CompositionalReward
    from samplers.masked_image import EmergeSampler
    from tasks.compositional import heldout_prompts, parse_prompt
    from tasks.compositional_render import render, sample_scene

    policy = build_policy("compositional_discrete", guidance_scale=2.0)
    assert isinstance(policy, AmusedPolicy)
    assert (policy.height, policy.width, policy.num_image_tokens) == (32, 32, 64)
    assert policy.mask_token_id == 64  # the codebook's 64 entries, then aMUSEd's mask id
    prompts = heldout_prompts()[::3]
    rng = random.Random(0)
    scenes = [sample_scene(parse_prompt(p), rng) for p in prompts]
    images = render(scenes, torch.Generator().manual_seed(0))
    tokens = policy.encode_images(images)
    assert tokens.shape == (len(prompts), 64) and int(tokens.max()) < 64
    decoded = policy.decode_images(tokens)
    scores = CompositionalReward()(decoded, prompts).scores["compositional"]
    assert scores.mean() >= 0.75, scores
    ids, mask = policy.encode_prompts(prompts)
    out = policy.generate(ids, mask, EmergeSampler(4), 64, torch.Generator().manual_seed(0))
    assert out.tokens.shape == (len(prompts), 64) and int(out.tokens.max()) < 64


def test_the_tokenizer_spells_every_grammar_word_as_one_token(build_script) -> None:
    tokenizer = build_script.build_tokenizer()
    for word in build_script.grammar_words():
        ids = tokenizer(word).input_ids
        assert len(ids) == 3, (word, ids)  # start, the word, end
    from tasks.compositional import TEMPLATES, all_specs

    texts = [spec.text(t) for spec in all_specs() for t in range(len(TEMPLATES))]
    longest = max(len(tokenizer(text).input_ids) for text in texts)
    assert longest <= build_script.MAX_PROMPT_TOKENS


@pytest.mark.slow
def test_build_pieces_are_deterministic(build_script) -> None:
    """The same seed gives the same initial weights, and two training steps of each model give
    the same weights twice (a different seed, different ones)."""

    def state(components):
        return {
            f"{k}.{n}": v.clone()
            for k in ("vqvae", "text_encoder", "transformer")
            for n, v in components[k].state_dict().items()
        }

    def trained(seed):
        components = build_script.build_models(seed, build_script.build_tokenizer())
        build_script.train_vq(components["vqvae"], 2)
        build_script.train_uvit(components, 2)
        return state(components)

    torch.use_deterministic_algorithms(True)
    try:
        first, second = trained(0), trained(0)
        fresh = state(build_script.build_models(0, build_script.build_tokenizer()))
        other = state(build_script.build_models(1, build_script.build_tokenizer()))
    finally:
        torch.use_deterministic_algorithms(False)
    assert all(torch.equal(first[k], second[k]) for k in first)
    assert any(not torch.equal(first[k], fresh[k]) for k in first)  # training moved them
    assert any(not torch.equal(fresh[k], other[k]) for k in fresh)


def test_two_steps_of_the_recipe_train_the_u_vit(tmp_path: Path) -> None:
    from accelerate.state import AcceleratorState

    from genrl import get_recipe
    from genrl.loop.trainer import Trainer

    config = get_recipe("compositional_discrete_maskgrpo")
    config.apply_overrides(
        [
            "generation.diffusion_steps=2",
            "train.prompts_per_iteration=4",
            "train.group_size=4",
            "train.minibatch_size=16",
            # the fraction of requirements met: groups this small rarely differ all-or-nothing
            'reward.0.kwargs={"partial_credit": true}',
            "train.iterations=2",
            f"output_dir={tmp_path / 'run'}",
            "logging.tensorboard=false",
            "logging.progress_bar=false",
        ]
    )
    AcceleratorState._reset_state(reset_partial_state=True)
    try:
        trainer = Trainer(config)
        assert trainer.policy.guidance_scale == 2.0
        before = {n: p.detach().clone() for n, p in trainer.policy.network.named_parameters()}
        first = trainer.train_iteration()
        trainer.train_iteration()
    finally:
        AcceleratorState._reset_state(reset_partial_state=True)
    assert first["loss/first_minibatch_ratio_deviation"] == 0.0
    after = dict(trainer.policy.network.named_parameters())
    assert any(not torch.equal(p, after[n]) for n, p in before.items())
