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
from reward_models import build_reward
from reward_models.moving_digits import MovingDigitReward, centred_windows, ink_centroids
from tasks.digits import DigitClassifier
from tasks.video_digits import (
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
    name = Path(EMBEDDED_VIDEO_FLOW).name
    path = embedded_asset_path(EMBEDDED_VIDEO_FLOW)
    entry = manifest["files"][name]
    assert set(manifest["files"]) == {name}
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
    scores = heldout_scores(load_video_flow_model(), MovingDigitReward())
    recorded = manifest["metrics"]["heldout"]
    for key, value in recorded.items():
        assert math.isclose(scores[key], value, abs_tol=2e-3), (key, scores[key], value)
    assert 0.3 <= scores["moving_digit"] <= 0.7


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


# -- the reward, by hand -------------------------------------------------------------------------
def _blob_clip(path: list[tuple[int, int]], size: int = 16) -> torch.Tensor:
    """One clip ``[1, F, 1, size, size]``: a 2x2 blob of ink whose top-left follows ``path``."""
    clip = torch.zeros(1, len(path), 1, size, size)
    for f, (r, c) in enumerate(path):
        clip[0, f, 0, r : r + 2, c : c + 2] = 1.0
    return clip


class _UniformClassifier(torch.nn.Module):
    """Zero logits: every digit gets probability 0.1, so ``digit`` is exactly 0.1."""

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return torch.zeros(images.shape[0], 10)


def _hand_reward() -> MovingDigitReward:
    reward = MovingDigitReward()
    reward._model = _UniformClassifier()
    return reward


def test_centroid_and_window_by_hand() -> None:
    frame = torch.zeros(1, 16, 16)
    frame[0, 4:6, 9:11] = 1.0  # 2x2 blob: centre (4.5, 9.5)
    frame[0, 15, 15] = 0.0
    assert torch.allclose(ink_centroids(frame), torch.tensor([[4.5, 9.5]]))
    # Window top-left = round(centre - 3.5) = (1, 6); the blob lands at rows 3-4, cols 3-4.
    window = centred_windows(frame, ink_centroids(frame))
    assert torch.equal(window[0, 0], frame[0, 1:9, 6:14])
    # Near the border the window is shifted inwards: centre (0.5, 15.5) -> top-left (0, 8).
    corner = torch.zeros(1, 16, 16)
    corner[0, 0:2, 14:16] = 1.0
    assert torch.equal(centred_windows(corner, ink_centroids(corner))[0, 0], corner[0, 0:8, 8:16])
    assert torch.allclose(ink_centroids(torch.zeros(1, 16, 16)), torch.tensor([[7.5, 7.5]]))


@pytest.mark.parametrize(
    ("path", "prompt", "motion"),
    [
        # 2 px left in 2 frame steps (expected travel 1 px/frame x 2) -> full score
        ([(7, 8), (7, 7), (7, 6)], "a 3 moving left", 1.0),
        ([(7, 8), (7, 8), (7, 7)], "a 3 moving left", 0.5),  # 1 of the 2 px
        ([(7, 8), (7, 7), (8, 6)], "a 3 moving left", 0.5),  # (2 along - 1 across) / 2
        ([(7, 8), (7, 9), (7, 10)], "a 3 moving left", 0.0),  # the wrong way
        ([(7, 8), (7, 9), (7, 10)], "a 3 moving right", 1.0),
        ([(7, 8), (6, 8), (5, 8)], "a 3 moving up", 1.0),
        ([(7, 8), (5, 8), (3, 8)], "a 3 moving down", 0.0),  # 4 px up
        ([(3, 8), (7, 8), (11, 8)], "a 3 moving down", 1.0),  # 8 px: clipped to 1
    ],
)
def test_motion_score_by_hand(path: list[tuple[int, int]], prompt: str, motion: float) -> None:
    out = _hand_reward()(_blob_clip(path), [prompt])
    assert out.scores["motion"].item() == pytest.approx(motion)
    assert out.scores["digit"].item() == pytest.approx(0.1)
    assert out.scores["moving_digit"].item() == pytest.approx(0.5 * 0.1 + 0.5 * motion)


def test_reward_is_batched_and_weighted() -> None:
    clips = torch.cat([_blob_clip([(7, 8), (7, 7), (7, 6)]), _blob_clip([(7, 8), (7, 8), (7, 7)])])
    reward = MovingDigitReward(digit_weight=0.25)
    reward._model = _UniformClassifier()
    scores = reward(clips, ["a 1 moving left", "the digit two moving left"]).scores
    assert torch.allclose(scores["motion"], torch.tensor([1.0, 0.5]))
    assert torch.allclose(scores["moving_digit"], 0.25 * 0.1 + 0.75 * torch.tensor([1.0, 0.5]))


def test_reward_reads_a_real_moving_digit() -> None:
    """A scikit-learn "3" rendered moving left: the embedded classifier reads it on every frame
    and the motion is exactly the expected 5 px."""
    pytest.importorskip("sklearn")
    from sklearn.datasets import load_digits

    digits = load_digits()
    three = torch.tensor(digits.images[digits.target == 3][0], dtype=torch.float32) / 16.0
    clip = render_clips(three[None], torch.tensor([0]), torch.tensor([[4, 8]]))
    out = build_reward("moving_digit")(clip, ["a 3 moving left"])
    assert out.scores["motion"].item() == pytest.approx(1.0)
    assert out.scores["digit"].item() > 0.9
    wrong = build_reward("moving_digit")(clip, ["a 3 moving right"])
    assert wrong.scores["motion"].item() == 0.0


def test_reward_refuses_images() -> None:
    with pytest.raises(ValueError, match="videos"):
        build_reward("moving_digit")(torch.zeros(2, 1, 16, 16), ["a 3 moving left"] * 2)


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


def test_a_full_run_writes_its_summary_and_videos(tmp_path: Path) -> None:
    """``Trainer.train()`` end to end: the summary and the before/after videos."""
    Trainer(_tiny_config(tmp_path), run_dir=tmp_path / "run").train()
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["recipe"] == "video_digits_flow_grpo"
    assert summary["heldout_samples"] == 40
    assert set(summary["heldout_scores_after"]) >= {"moving_digit/digit", "moving_digit/motion"}
    for name in (
        "samples_before.gif",
        "samples_after.gif",
        "samples_before_after.gif",
        "score_curves.png",
    ):
        assert (tmp_path / "run" / name).is_file()
