"""The embedded video task: the shipped clip generator and its manifest, prompts, clip rendering,
the ``moving_digit`` reward on hand-drawn clips, the video policy, and every flow algorithm
training on it through the generic trainer (no video-specific code in any of them)."""

from __future__ import annotations

import hashlib
import json
import math
import sys
from pathlib import Path

import pytest
import torch

from genrl import Trainer, get_recipe
from genrl.run.config import TrainConfig
from loading.assets import embedded_asset_path, save_model
from pipelines.toy.video import (
    CANVAS,
    EMBEDDED_VIDEO_FLOW,
    FRAMES,
    MovingDigitFlowModel,
    load_video_flow_model,
    random_starts,
    render_clips,
    save_video_model,
)
from pipelines.toy.video_policy import ToyVideoDigitsPolicy
from reward_models.moving_digits import (
    MovingDigitJudge,
    MovingDigitReward,
    ink_centroids,
)
from tasks.digits import DigitClassifier
from tasks.video_digits import (
    EMBEDDED_VIDEO_CLASSIFIER,
    EMBEDDED_VIDEO_JUDGE,
    VIDEO_EVAL_PROMPTS,
    VIDEO_TRAIN_PROMPTS,
    parse_video_prompt,
    video_prompt_for,
)

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


# -- the shipped asset ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def manifest() -> dict:
    return json.loads(embedded_asset_path("video_digits/manifest.json").read_text())


def test_asset_matches_manifest(manifest: dict) -> None:
    names = [EMBEDDED_VIDEO_FLOW, EMBEDDED_VIDEO_CLASSIFIER, EMBEDDED_VIDEO_JUDGE]
    assert set(manifest["files"]) == {Path(n).name for n in names}
    for name in names:
        path = embedded_asset_path(name)
        entry = manifest["files"][Path(name).name]
        assert hashlib.sha256(path.read_bytes()).hexdigest() == entry["sha256"]
        assert path.stat().st_size == entry["size_bytes"] < 4_000_000  # "a few MB"
    model = load_video_flow_model()
    assert model.config == {k: manifest["model"][k] for k in model.config}
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert sum(p.numel() for p in model.parameters()) == manifest["model"]["parameters"]


def test_heldout_reward_matches_manifest(manifest: dict) -> None:
    """The build's held-out protocol on the shipped (float16-stored) weights gives the manifest's
    numbers, and the base reward leaves RL its headroom."""
    sys.path.insert(0, str(SCRIPTS))
    try:
        from build_video_assets import heldout_scores
    finally:
        sys.path.remove(str(SCRIPTS))
    model = load_video_flow_model()
    for reward, key in ((MovingDigitReward(), "heldout"), (MovingDigitJudge(), "heldout_judge")):
        scores = heldout_scores(model, reward)
        recorded = manifest["metrics"][key]
        assert set(scores) == set(recorded)
        for name, value in recorded.items():
            assert math.isclose(scores[name], value, abs_tol=2e-3), (name, scores[name], value)
    assert 0.3 <= manifest["metrics"]["heldout"]["moving_digit"] <= 0.7


# -- prompts and clips ---------------------------------------------------------------------------
def test_prompts_parse_back() -> None:
    assert parse_video_prompt("a 3 moving left") == (3, 0)
    assert parse_video_prompt("the digit seven moving Down") == (7, 3)
    assert video_prompt_for(9, 2, template=2) == "a handwritten nine sliding up"
    assert len(VIDEO_EVAL_PROMPTS) == 40 and len(set(VIDEO_TRAIN_PROMPTS)) == 120
    # The held-out wording is a fourth template, which no training prompt uses.
    assert VIDEO_EVAL_PROMPTS[13] == "the number three heading right"
    assert not set(VIDEO_EVAL_PROMPTS) & set(VIDEO_TRAIN_PROMPTS)
    assert {parse_video_prompt(p) for p in VIDEO_EVAL_PROMPTS} == {
        (d, k) for d in range(10) for k in range(4)
    }
    for bad in ("a 3 moving", "a 3 moving left then right", "a moving left"):
        with pytest.raises(ValueError):
            parse_video_prompt(bad)


def test_clips_move_one_pixel_per_frame_and_stay_on_the_canvas() -> None:
    gen = torch.Generator().manual_seed(0)
    directions = torch.arange(4).repeat(50)
    digits = torch.rand(200, 8, 8, generator=gen) + 0.1  # every pixel inked
    clips = render_clips(digits, directions, random_starts(directions, gen))
    assert clips.shape == (200, FRAMES, 1, CANVAS, CANVAS)
    assert torch.allclose(clips.sum(dim=(2, 3, 4)), digits.sum(dim=(1, 2))[:, None])
    centroids = ink_centroids(clips[:, :, 0].flatten(0, 1)).reshape(200, FRAMES, 2)
    steps = centroids.diff(dim=1)  # [B, F - 1, 2]
    expected = torch.tensor([[0, -1], [0, 1], [-1, 0], [1, 0]], dtype=torch.float32)[directions]
    assert torch.allclose(steps, expected[:, None].expand_as(steps), atol=1e-5)


# -- the policy ----------------------------------------------------------------------------------
def test_policy_decodes_videos_and_guides() -> None:
    policy = ToyVideoDigitsPolicy()
    assert policy.latent_shape == (FRAMES, 1, CANVAS, CANVAS)
    condition = policy.encode_prompts(["a 3 moving left", "the digit nine moving up"])
    assert condition["digits"].tolist() == [3, 9]
    assert condition["directions"].tolist() == [0, 2]
    assert policy.null_condition(condition)["digits"].tolist() == [10, 10]
    x = torch.randn(2, *policy.latent_shape)
    sigma = torch.full((2,), 0.5)
    v = policy.velocity(x, sigma, condition)
    assert v.shape == x.shape
    assert policy.velocity(x, sigma, condition, guidance_scale=3.0).shape == x.shape
    videos = policy.decode(x)
    assert videos.shape == (2, FRAMES, 1, CANVAS, CANVAS)
    assert videos.min() >= 0 and videos.max() <= 1


def test_float16_storage_round_trip(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = MovingDigitFlowModel(hidden_dim=16, num_layers=1)
    save_video_model(model, tmp_path / "m.safetensors")
    loaded = load_video_flow_model(tmp_path / "m.safetensors")
    for name, p in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], p.half().float())


# -- training through the generic trainer ------------------------------------------------------
def _tiny_config(directory: Path, *overrides: str) -> TrainConfig:
    """The video recipe on tiny random models, a few seconds per run."""
    torch.manual_seed(0)
    flow, clf = directory / "video.safetensors", directory / "clf.safetensors"
    save_video_model(MovingDigitFlowModel(hidden_dim=32, num_layers=1), flow)
    save_model(DigitClassifier(channels=4, hidden_dim=16), clf)
    config = get_recipe("video_digits_flow_grpo")
    config.apply_overrides(
        [
            f"policy.pretrained={flow}",
            f'reward.0.kwargs={{"path": "{clf}"}}',
            "train.iterations=2",
            "train.prompts_per_iteration=4",
            "train.group_size=4",
            "train.minibatch_size=16",
            "sampler.num_steps=4",
            "sampler.eval_num_steps=4",
            "eval.samples_per_prompt=1",
            "logging.tensorboard=false",
            "logging.progress_bar=false",
            "logging.log_every=1000",
            "optim.lr=1e-2",
            *overrides,
        ]
    )
    return config


def test_recipes_log_the_judge_at_weight_zero() -> None:
    for name in ("video_digits_flow_grpo", "video_digits_diffusion_nft"):
        weights = {spec.name: spec.weight for spec in get_recipe(name).reward}
        assert weights == {"moving_digit": 1.0, "moving_digit_judge": 0.0}, name


# Each flow algorithm as the image task configures it, only the step counts shrunk to 4.
ALGORITHMS = {
    "flow_grpo": (),
    "flow_grpo_fast": ("sampler.sde_window_size=2", "sampler.sde_window_range=[0, 3]"),
    "mix_grpo": ("sampler.sde_window_size=2", "sampler.sde_window_schedule=progressive"),
    "branch_grpo": (
        "algorithm.name=branch_grpo",
        "algorithm.split_steps=[0, 1]",
        "algorithm.branching=[2, 2]",
    ),
    "ram": ("algorithm.name=ram", "algorithm.noisings_per_sample=2"),
    "gdro": ("algorithm.name=gdro", "algorithm.noisings_per_sample=2", "train.minibatch_size=4"),
    "diffusion_nft": ("algorithm.name=diffusion_nft", "algorithm.noisings_per_sample=2"),
}


@pytest.mark.parametrize("name", list(ALGORITHMS))
def test_each_flow_algorithm_trains_the_video_policy(tmp_path: Path, name: str) -> None:
    trainer = Trainer(_tiny_config(tmp_path, *ALGORITHMS[name]), run_dir=tmp_path / "run")
    before = {n: p.detach().clone() for n, p in trainer.policy.network.named_parameters()}
    metrics = trainer.train_iteration()
    trainer.train_iteration()
    after = dict(trainer.policy.network.named_parameters())
    changed = sum(not torch.equal(p, after[n]) for n, p in before.items())
    assert changed >= 0.9 * len(before), f"{name}: only {changed}/{len(before)} tensors moved"
    assert math.isfinite(metrics["loss/total"])
    assert 0.0 <= metrics["moving_digit/mean"] <= 1.0


@pytest.mark.slow  # moved from the fast lane (kept under 3 minutes)
def test_a_full_run_writes_its_summary_and_videos(tmp_path: Path) -> None:
    """``Trainer.train()`` end to end: the summary and the before/after videos."""
    Trainer(_tiny_config(tmp_path), run_dir=tmp_path / "run").train()
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["recipe"] == "video_digits_flow_grpo"
    assert summary["heldout_samples"] == 40
    # The judge and the speckle are reported beside the training reward, which they do not enter.
    assert set(summary["heldout_scores_after"]) >= {
        "moving_digit/digit",
        "moving_digit/motion",
        "moving_digit/tidy",
        "moving_digit_judge",
        "moving_digit_judge/speckle",
    }
    assert summary["heldout_scores_after"]["reward"] == pytest.approx(
        summary["heldout_scores_after"]["moving_digit"]
    )
    for name in (
        "samples_before.gif",
        "samples_after.gif",
        "samples_before_after.gif",
        "score_curves.png",
    ):
        assert (tmp_path / "run" / name).is_file()
