"""Video rewards against numbers computed by hand: frame_reward over a weight-free image reward,
VBench's consistency formula on chosen features and through tiny DINO/CLIP backbones, motion
smoothness on ramps and jumps, and the VLM judge on frame grids (tiny LLaVA, fake endpoint)."""

from __future__ import annotations

import json
import math
import threading
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from diffusers_tiny import build_clip
from vision_tiny import build_dinov2, build_llava

from reward_models import CallableReward, CompositeReward, RewardModel, RewardOutput, build_reward
from reward_models.vbench import FeatureConsistency
from reward_models.video import FrameReward, frame_indices, tile_frames

RED, BLACK, WHITE = (1.0, 0.0, 0.0), (0.0, 0.0, 0.0), (1.0, 1.0, 1.0)


def clip_of(*colours: tuple[float, ...], size: int = 4) -> torch.Tensor:
    """One video ``[F, C, size, size]`` whose frame ``i`` is filled with ``colours[i]``."""
    return torch.stack([torch.tensor(c).view(-1, 1, 1).expand(-1, size, size) for c in colours])


def random_videos(b: int, f: int, h: int, w: int, seed: int = 0) -> torch.Tensor:
    return torch.rand(b, f, 3, h, w, generator=torch.Generator().manual_seed(seed))


# -- frame_reward ------------------------------------------------------------------------------


class Recorder(RewardModel):
    """An image reward that records its calls; scores each image by its mean pixel and says
    "not applicable" for black images; stateful for the forwarding tests."""

    name = "recorder"
    accepts = ("images",)

    def __init__(self) -> None:
        self.calls: list[tuple[tuple[int, ...], list[str], Any]] = []
        self.updates: list[tuple[int, ...]] = []
        self.state: dict[str, Any] = {"seen": 0}

    def score(
        self, outputs: torch.Tensor, prompts: list[str], metadata: list[dict[str, Any]] | None
    ) -> RewardOutput:
        self.calls.append((tuple(outputs.shape), prompts, metadata))
        mean = outputs.mean(dim=(1, 2, 3))
        applicable = mean > 0
        value = torch.where(applicable, mean, math.nan)
        return RewardOutput(
            {self.name: value, "double": 2 * mean}, {self.name: applicable}, [{"m": 1}] * len(mean)
        )

    def update(self, outputs, prompts, metadata=None, gather=None) -> dict[str, float]:  # type: ignore[no-untyped-def]
        self.updates.append(tuple(outputs.shape))
        return {"n": float(len(prompts))}

    def state_dict(self) -> dict[str, Any]:
        return dict(self.state)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.state = dict(state)


def test_frame_indices() -> None:
    assert frame_indices(5, "all") == [0, 1, 2, 3, 4]
    assert frame_indices(10, 4) == [0, 3, 6, 9]  # first and last always in
    assert frame_indices(4, 3) == [0, 2, 3]  # round(1.5) = 2
    assert frame_indices(3, 7) == [0, 1, 2] and frame_indices(6, 1) == [0]
    assert frame_indices(6, [0, -1, 2]) == [0, 5, 2]
    for bad in (0, [6], [], "some", True):
        with pytest.raises(ValueError, match="frames"):
            frame_indices(6, bad)  # type: ignore[arg-type]


def test_frame_reward_target_color_mean_and_min_by_hand() -> None:
    # target_color (red) = 1 - mean ||rgb - red||^2 / 3: red 1, black 1 - 1/3, white 1 - 2/3.
    videos = torch.stack([clip_of(RED, BLACK, WHITE), clip_of(RED, RED, RED)])
    spec = {"name": "target_color"}
    mean = build_reward("frame_reward", reward=spec)
    assert mean.name == "frame_target_color" and mean.accepts == ("videos",)
    out = mean(videos, ["a", "b"])
    torch.testing.assert_close(out.scores["frame_target_color"], torch.tensor([2 / 3, 1.0]))
    torch.testing.assert_close(out.scores["frame_min"], torch.tensor([1 / 3, 1.0]))
    torch.testing.assert_close(out.scores["frame_mean"], torch.tensor([2 / 3, 1.0]))
    low = build_reward("frame_reward", reward=spec, aggregate="min")(videos, ["a", "b"])
    torch.testing.assert_close(low.scores["frame_target_color"], torch.tensor([1 / 3, 1.0]))
    # Two evenly spaced frames are the first and the last: (1 + 1/3) / 2.
    ends = build_reward("frame_reward", reward=spec, frames=2)(videos, ["a", "b"])
    torch.testing.assert_close(ends.scores["frame_target_color"], torch.tensor([2 / 3, 1.0]))
    middle = build_reward("frame_reward", reward=spec, frames=[1])(videos, ["a", "b"])
    torch.testing.assert_close(middle.scores["frame_target_color"], torch.tensor([2 / 3, 1.0]))
    # Chunked calls of the image reward give the same numbers.
    chunked = build_reward("frame_reward", reward=spec, batch_size=4)(videos, ["a", "b"])
    torch.testing.assert_close(chunked.scores["frame_min"], out.scores["frame_min"])


def test_frame_reward_is_one_batched_call_with_prompts_and_metadata_per_frame() -> None:
    inner = Recorder()
    reward = FrameReward(inner, frames=[0, 2])
    videos = torch.stack([clip_of(RED, BLACK, WHITE), clip_of(WHITE, WHITE, WHITE)])
    reward(videos, ["a", "b"], [{"k": 1}, {"k": 2}])
    assert inner.calls == [
        ((4, 3, 4, 4), ["a", "a", "b", "b"], [{"k": 1}, {"k": 1}, {"k": 2}, {"k": 2}])
    ]
    FrameReward(inner, batch_size=4)(videos, ["a", "b"])
    assert [c[0][0] for c in inner.calls[1:]] == [4, 2]


def test_frame_reward_skips_frames_that_are_not_applicable() -> None:
    # Recorder: a frame's mean pixel; black frames are not applicable.
    videos = torch.stack([clip_of(RED, BLACK, WHITE), clip_of(BLACK, BLACK, BLACK)])
    out = FrameReward(Recorder())(videos, ["a", "b"])
    primary = out.scores["frame_recorder"]
    assert primary[0].item() == pytest.approx((1 / 3 + 1) / 2) and math.isnan(primary[1])
    assert out.scores["frame_min"][0].item() == pytest.approx(1 / 3) and math.isnan(
        out.scores["frame_min"][1]
    )
    assert out.applicable["frame_recorder"].tolist() == [True, False]
    # The extra score is averaged over all frames (it has no applicability of its own).
    torch.testing.assert_close(out.scores["double"], torch.tensor([(2 / 3 + 0 + 2) / 3, 0.0]))
    assert out.info is not None and out.info[0] == {"frames": [{"m": 1}] * 3}
    # A composite skips the video the reward does not apply to, instead of failing.
    color = build_reward("frame_reward", reward={"name": "target_color"})
    total = CompositeReward([(FrameReward(Recorder()), 1.0), (color, 1.0)])(videos, ["a", "b"])
    assert total.scores["reward"][1].item() == pytest.approx(2 * (2 / 3))


def test_frame_reward_forwards_state_and_updates() -> None:
    inner = Recorder()
    reward = FrameReward(inner, frames=2)
    assert reward.update(torch.rand(3, 5, 3, 4, 4), ["p"] * 3) == {"n": 6.0}
    assert inner.updates == [(6, 3, 4, 4)]
    reward.load_state_dict({"seen": 7})
    assert reward.state_dict() == {"seen": 7} and inner.state == {"seen": 7}


def test_frame_reward_refuses_non_image_rewards_and_images() -> None:
    with pytest.raises(ValueError, match="not images"):
        build_reward("frame_reward", reward={"name": "countdown"})
    with pytest.raises(ValueError, match="aggregate"):
        build_reward("frame_reward", reward={"name": "target_color"}, aggregate="max")
    reward = build_reward("frame_reward", reward={"name": "target_color"})
    with pytest.raises(ValueError, match="scores videos, got images"):
        reward(torch.rand(2, 3, 4, 4), ["a", "b"])
    # And the image reward itself points at frame_reward for videos.
    with pytest.raises(ValueError, match="FrameReward"):
        build_reward("target_color")(torch.rand(1, 2, 3, 4, 4), ["a"])


# -- VBench consistency ------------------------------------------------------------------------


def channel_features(frames: torch.Tensor) -> torch.Tensor:
    """Stub backbone: a frame's feature is its mean colour mapped from [0, 1] to [-1, 1]."""
    return frames.mean(dim=(2, 3)) * 2 - 1


def test_consistency_formula_by_hand() -> None:
    # Video 1: features e0, -e0, e0. i=1: cos -1 clamps to 0 (both terms); i=2: previous -1 -> 0,
    # first 1. Score ((0 + 0) / 2 + (0 + 1) / 2) / 2 = 1/4.
    # Video 2: e0, (e0 + e1) / sqrt2, e1. i=1: both 1/sqrt2; i=2: previous 1/sqrt2, first 0.
    # Score (1/sqrt2 + 1 / (2 sqrt2)) / 2 = 3 / (4 sqrt2).
    videos = torch.stack(
        [
            clip_of((1, 0.5, 0.5), (0, 0.5, 0.5), (1, 0.5, 0.5)),
            clip_of((1, 0.5, 0.5), (1, 1, 0.5), (0.5, 1, 0.5)),
        ]
    )
    seen: list[int] = []

    def features(frames: torch.Tensor) -> torch.Tensor:
        seen.append(frames.shape[0])
        return channel_features(frames)

    out = FeatureConsistency(features, name="stub", batch_size=4)(videos, ["a", "b"])
    r = 1 / math.sqrt(2)
    torch.testing.assert_close(out.scores["stub"], torch.tensor([0.25, 3 * r / 4]))
    torch.testing.assert_close(out.scores["previous"], torch.tensor([0.0, r]))
    torch.testing.assert_close(out.scores["first"], torch.tensor([0.5, r / 2]))
    assert seen == [4, 2]  # all six frames of both videos, in chunks of batch_size
    with pytest.raises(ValueError, match="at least 2 frames"):
        FeatureConsistency(features)(videos[:, :1], ["a", "b"])


def vbench_loop(features: torch.Tensor) -> float:
    """VBench's per-video loop (``subject_consistency.py``), written out for one ``[F, D]``."""
    features = F.normalize(features, dim=-1, p=2)
    total = 0.0
    for i in range(1, len(features)):
        previous = max(0.0, F.cosine_similarity(features[i - 1 : i], features[i : i + 1]).item())
        first = max(0.0, F.cosine_similarity(features[:1], features[i : i + 1]).item())
        total += (previous + first) / 2
    return total / (len(features) - 1)


@pytest.fixture(scope="module")
def dinov2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_dinov2(tmp_path_factory.mktemp("dinov2"))


@pytest.fixture(scope="module")
def dino_v1(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny ViT saved like ``facebook/dino-vitb16`` (ViTModel + ViT image processor)."""
    from transformers import ViTConfig, ViTModel

    directory = tmp_path_factory.mktemp("dino_v1")
    torch.manual_seed(0)
    config = ViTConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
        image_size=32, patch_size=8,
    )  # fmt: skip
    ViTModel(config).save_pretrained(directory)
    processor = {
        "image_processor_type": "ViTImageProcessor",
        "size": {"height": 32, "width": 32},
        "image_mean": [0.485, 0.456, 0.406],
        "image_std": [0.229, 0.224, 0.225],
    }
    (directory / "preprocessor_config.json").write_text(json.dumps(processor))
    return directory


@pytest.mark.parametrize("backbone", ["dinov2", "dino_v1"])
def test_subject_consistency_through_a_tiny_dino(backbone: str, request: Any) -> None:
    from transformers import AutoModel

    directory = request.getfixturevalue(backbone)
    reward = build_reward("subject_consistency", model=str(directory), size=32, batch_size=3)
    videos = random_videos(3, 4, 40, 48)  # not square: VBench resizes without cropping
    out = reward(videos, ["a"] * 3)
    single = torch.cat(
        [reward(videos[i : i + 1], ["a"]).scores["subject_consistency"] for i in range(3)]
    )
    torch.testing.assert_close(single, out.scores["subject_consistency"], atol=1e-5, rtol=0)
    # By hand: short side 40 -> 32 (48 -> int(32 * 48 / 40) = 38), bilinear, ImageNet
    # normalisation, CLS token; then VBench's loop.
    model = AutoModel.from_pretrained(str(directory)).eval()
    frames = F.interpolate(videos.flatten(0, 1), size=(32, 38), mode="bilinear", antialias=False)
    mean = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1)
    std = torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1)
    extra = {"interpolate_pos_encoding": True} if backbone == "dino_v1" else {}
    with torch.no_grad():
        cls = model(pixel_values=(frames - mean) / std, **extra).last_hidden_state[:, 0]
    expected = [vbench_loop(cls.reshape(3, 4, -1)[i]) for i in range(3)]
    assert out.scores["subject_consistency"].tolist() == pytest.approx(expected, abs=1e-5)
    # A static video is perfectly consistent.
    static = videos[:1, :1].expand(1, 5, -1, -1, -1)
    assert reward(static, ["a"]).scores["subject_consistency"].item() == pytest.approx(
        1.0, abs=1e-5
    )


@pytest.fixture(scope="module")
def clip_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_clip(tmp_path_factory.mktemp("clip"))


def test_background_consistency_through_a_tiny_clip(clip_dir: Path) -> None:
    from transformers import CLIPModel

    from reward_models.clip import projected_embedding

    reward = build_reward("background_consistency", model=str(clip_dir), size=32, batch_size=5)
    videos = random_videos(2, 3, 36, 48, seed=1)
    out = reward(videos, ["a", "b"])
    single = torch.cat(
        [reward(videos[i : i + 1], ["a"]).scores["background_consistency"] for i in range(2)]
    )
    torch.testing.assert_close(single, out.scores["background_consistency"], atol=1e-5, rtol=0)
    # By hand: short side 36 -> 32 (48 -> 42), bicubic, centre crop 32 (columns 5..36), CLIP
    # normalisation, projected embedding; then VBench's loop.
    model = CLIPModel.from_pretrained(str(clip_dir)).eval()
    frames = F.interpolate(videos.flatten(0, 1), size=(32, 42), mode="bicubic", antialias=False)
    frames = frames[..., :, 5:37]
    mean = torch.tensor([0.48145466, 0.4578275, 0.40821073]).view(1, 3, 1, 1)
    std = torch.tensor([0.26862954, 0.26130258, 0.27577711]).view(1, 3, 1, 1)
    with torch.no_grad():
        emb = projected_embedding(model.get_image_features(pixel_values=(frames - mean) / std))
    expected = [vbench_loop(emb.reshape(2, 3, -1)[i]) for i in range(2)]
    assert out.scores["background_consistency"].tolist() == pytest.approx(expected, abs=1e-5)
    static = videos[1:, 1:2].expand(1, 4, -1, -1, -1)
    assert reward(static, ["a"]).scores["background_consistency"].item() == pytest.approx(
        1.0, abs=1e-5
    )


# -- motion smoothness -------------------------------------------------------------------------


def grey_clip(*levels: int, size: int = 4) -> torch.Tensor:
    """``[F, 3, size, size]`` with frame ``i`` at grey level ``levels[i] / 255``."""
    return torch.stack([torch.full((3, size, size), level / 255) for level in levels])


def test_motion_smoothness_is_one_on_a_linear_ramp() -> None:
    # Kept frames 10, 18, 26; the averages 14 and 22 are exactly frames 1 and 3.
    reward = build_reward("motion_smoothness")
    out = reward(grey_clip(10, 14, 18, 22, 26)[None], ["a"])
    assert out.scores["motion_smoothness"].item() == 1.0
    assert out.scores["interpolation_error"].item() == 0.0


def test_motion_smoothness_of_a_jump_by_hand() -> None:
    # Frames 0, 0, 255: the midpoint 127.5 truncates to 127 (AMT's tensor2img) against frame 1
    # at 0: (255 - 127) / 255. Unquantised: 1 - 0.5.
    jump = grey_clip(0, 0, 255)[None]
    reward = build_reward("motion_smoothness")
    assert reward(jump, ["a"]).scores["motion_smoothness"].item() == pytest.approx(128 / 255)
    exact = build_reward("motion_smoothness", quantize=False)
    assert exact(jump, ["a"]).scores["motion_smoothness"].item() == pytest.approx(0.5)
    # Half the pixels of frame 1 at 255: |255 - 127| on half, |0 - 127| on the other half.
    half = grey_clip(0, 0, 255)
    half[1, :, :2] = 1.0
    expected = 1 - (128 + 127) / 2 / 255
    assert reward(half[None], ["a"]).scores["motion_smoothness"].item() == pytest.approx(expected)


def test_motion_smoothness_even_frames_batches_and_interpolators() -> None:
    # With four frames the last one has no prediction (VBench drops it): 200 changes nothing.
    ramp, spoiled = grey_clip(10, 14, 18, 22), grey_clip(10, 14, 18, 200)
    videos = torch.stack([ramp, spoiled, grey_clip(0, 0, 255, 0)])
    reward = build_reward("motion_smoothness", batch_size=2)
    out = reward(videos, ["a"] * 3).scores["motion_smoothness"]
    assert out.tolist() == pytest.approx([1.0, 1.0, 128 / 255])
    # A pluggable interpolator: "hold the previous frame" misses the ramp by 4 levels.
    hold = build_reward("motion_smoothness", interpolator=lambda before, after: before)
    assert hold(ramp[None], ["a"]).scores["motion_smoothness"].item() == pytest.approx(1 - 4 / 255)
    named = build_reward(
        "motion_smoothness", interpolator="reward_models.vbench:average_interpolator"
    )
    torch.testing.assert_close(named(videos, ["a"] * 3).scores["motion_smoothness"], out)
    with pytest.raises(ValueError, match="at least 3 frames"):
        reward(videos[:, :2], ["a"] * 3)
    with pytest.raises(ValueError, match="interpolator"):
        build_reward("motion_smoothness", interpolator="amt")


def test_video_rewards_compose_with_weights() -> None:
    composite = CompositeReward(
        [
            (build_reward("frame_reward", reward={"name": "target_color"}), 1.0),
            (build_reward("motion_smoothness"), 0.5),
        ]
    )
    assert composite.accepts == ("videos",)
    video = torch.stack([torch.full((3, 4, 4), 0.0) for _ in range(3)])
    video[:, 0] = 1.0  # red throughout: target_color 1, motion smoothness 1
    out = composite(video[None], ["a"])
    assert out.scores["reward"].item() == pytest.approx(1.5)
    assert set(out.scores) >= {
        "frame_target_color/frame_min",
        "motion_smoothness/interpolation_error",
    }


# -- VLM judge over frames ---------------------------------------------------------------------


def test_tile_frames_by_hand() -> None:
    frames = torch.arange(1, 4).float().view(1, 3, 1, 1, 1).expand(1, 3, 1, 2, 2)
    grid = tile_frames(frames, columns=2)
    expected = torch.tensor(
        [[1, 1, 2, 2], [1, 1, 2, 2], [3, 3, 0, 0], [3, 3, 0, 0]], dtype=torch.float32
    )
    torch.testing.assert_close(grid, expected.view(1, 1, 4, 4))


@pytest.fixture(scope="module")
def llava(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_llava(tmp_path_factory.mktemp("llava"))


def test_video_judge_asks_the_image_judge_about_a_frame_grid(llava: Path) -> None:
    videos = random_videos(3, 6, 16, 16, seed=2)
    prompts = ["a cat", "Yes", "a cat running fast"]  # different lengths pad in one batch
    judge = build_reward(
        "video_judge", model=str(llava), frames=4, question="Does this image {prompt}",
        batch_size=3,
    )  # fmt: skip
    out = judge(videos, prompts)
    # Frames 0, 2, 3, 5 (round(linspace(0, 5, 4))) in a 2 x 2 grid of 32 x 32.
    grids = judge.grids(videos)  # type: ignore[attr-defined]
    assert grids.shape == (3, 3, 32, 32)
    torch.testing.assert_close(grids[:, :, 16:, :16], videos[:, 3])
    # The same answers from artifact_judge asked each question about each grid, one at a time.
    for i, prompt in enumerate(prompts):
        image_judge = build_reward(
            "artifact_judge", model=str(llava), question=f"Does this image {prompt}"
        )
        p_yes = image_judge(grids[i : i + 1], [prompt]).scores["p_yes"]
        assert out.scores["p_yes"][i].item() == pytest.approx(p_yes.item(), abs=1e-5)
    torch.testing.assert_close(out.scores["video_judge"], out.scores["p_yes"])
    flipped = build_reward(
        "video_judge", model=str(llava), frames=4, question="Does this image {prompt}",
        reward_answer="no",
    )  # fmt: skip
    no = flipped(videos, prompts).scores["video_judge"]
    torch.testing.assert_close(no, 1 - out.scores["p_yes"], atol=1e-5, rtol=0)


def test_video_judge_over_an_endpoint_puts_the_prompt_in_the_question() -> None:
    from test_artifact_judge import FakeEndpoint

    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeEndpoint)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    FakeEndpoint.requests.clear()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/v1"
        judge = build_reward("video_judge", endpoint=url, frames=3)
        out = judge(random_videos(2, 5, 8, 8), ["a red fox", "rain"])
        requests = list(FakeEndpoint.requests)
    finally:
        server.shutdown()
        FakeEndpoint.requests.clear()  # the class is shared with test_artifact_judge.py
    assert out.scores["video_judge"].tolist() == pytest.approx([0.3 / 0.8] * 2)
    asked = sorted(r["messages"][0]["content"][1]["text"] for r in requests)
    assert "3 frames" in asked[0] and "of: a red fox?" in asked[0] and "of: rain?" in asked[1]


def test_frame_reward_wraps_a_trl_callable() -> None:
    # A TRL-style callable accepts every kind; wrapped, it is called with frames.
    calls: list[int] = []

    def brightness(prompts: list[str], completions: torch.Tensor, **_: Any) -> list[float]:
        calls.append(completions.ndim)
        return completions.mean(dim=(1, 2, 3)).tolist()

    reward = FrameReward(CallableReward(brightness), frames=[0])
    out = reward(grey_clip(51, 0, 0)[None], ["a"])
    assert calls == [4] and out.scores["frame_brightness"].item() == pytest.approx(0.2)
