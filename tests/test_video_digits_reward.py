"""The embedded video task's rewards on hand-drawn and real clips: ``moving_digit`` (locating the
digit by its ink, the window classifier, motion and ``tidy``) and its held-out judge
``moving_digit_judge`` (the frame classifier and ``speckle``), with numbers worked out by hand."""

from __future__ import annotations

import pytest
import torch

from pipelines.toy.video import render_clips
from reward_models import build_reward
from reward_models.moving_digits import (
    MovingDigitJudge,
    MovingDigitReward,
    centred_windows,
    ink_centroids,
    locate_digits,
    speckle_fractions,
)
from tasks.video_digits import FrameDigitJudge


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


def test_faint_speckle_does_not_move_the_digit() -> None:
    """Grey speckle below the ink threshold (0.3) weighs nothing in the located centre; the
    intensity-weighted centroid of every pixel is dragged towards the canvas's middle."""
    frame = torch.zeros(1, 16, 16)
    frame[0, 4:6, 9:11] = 1.0  # centre (4.5, 9.5)
    speckled = frame.clone()
    speckled[0, ::2, ::2] = speckled[0, ::2, ::2].clamp_min(0.25)  # 64 pixels, 63 of them new
    centres, corners = locate_digits(speckled)
    assert torch.allclose(centres, torch.tensor([[4.5, 9.5]]))
    assert corners.tolist() == [[1, 6]]  # round(4.5 - 3.5), round(9.5 - 3.5)
    # All pixels weighted: mass 4 + 63 * 0.25 = 19.75; the speckle's rows average 7.
    assert not torch.allclose(ink_centroids(speckled), torch.tensor([[4.5, 9.5]]), atol=1.0)


def test_stray_ink_costs_reward_by_hand() -> None:
    """A 2x2 blob and one stray bright pixel: the window settles on the blob (the stray pixel
    pulls only the first placement), and ``tidy`` is the blob's share of the ink, 4 / 5."""
    clip = _blob_clip([(4, 9), (4, 9)])
    clip[0, :, 0, 15, 0] = 1.0
    # First placement: centroid of all 5 ink pixels (6.6, 7.6) -> window rows 3-10, cols 4-11,
    # which holds the blob only; re-centred on it: (4.5, 9.5).
    centres, _ = locate_digits(clip[0, :, 0])
    assert torch.allclose(centres, torch.tensor([[4.5, 9.5], [4.5, 9.5]]))
    out = _hand_reward()(clip, ["a 3 moving left"]).scores
    assert out["tidy"].item() == pytest.approx(0.8)
    assert out["motion"].item() == 0.0  # it stands still
    assert out["moving_digit"].item() == pytest.approx(0.8 * (0.5 * 0.1 + 0.5 * 0.0))
    # A blank clip has no ink out of place: tidy 1, and the centre of the canvas.
    blank = _hand_reward()(torch.zeros(1, 2, 1, 16, 16), ["a 3 moving left"]).scores
    assert blank["tidy"].item() == 1.0


def test_speckle_fraction_by_hand() -> None:
    blank = torch.zeros(2, 16, 16)
    blank[0].view(-1)[torch.arange(0, 256, 26)] = 0.3  # 10 speckles, no stroke: all background
    assert speckle_fractions(blank).tolist() == pytest.approx([10 / 256, 0.0])
    frame = torch.zeros(1, 16, 16)
    frame[0, 4:6, 9:11] = 1.0  # strokes: box rows 4-5, cols 9-10, grown to rows 3-6, cols 8-11
    frame[0, 0, 0] = 0.2  # background speckle
    frame[0, 5, 8] = 0.2  # inside the grown box: the digit's own faint edge
    frame[0, 15, 15] = 0.05  # too faint to count
    assert speckle_fractions(frame).item() == pytest.approx(1 / (256 - 16))


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
    assert out.scores["tidy"].item() == 1.0
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


def test_speckle_is_not_a_digit_to_the_reward_and_shows_to_the_judge() -> None:
    """The embedded classifiers on a real "3" moving left, clean and under grey speckle: the
    reward's classifier calls speckle alone "no digit", the speckled clip loses reward through
    ``tidy`` and the classifier, and the judge's ``speckle`` rises from 0."""
    pytest.importorskip("sklearn")
    from sklearn.datasets import load_digits

    from tasks.video_digits import NO_DIGIT, load_video_classifier

    digits = load_digits()
    three = torch.tensor(digits.images[digits.target == 3][0], dtype=torch.float32) / 16.0
    clip = render_clips(three[None], torch.tensor([0]), torch.tensor([[4, 8]]))
    gen = torch.Generator().manual_seed(0)
    hit = torch.rand(clip.shape, generator=gen) < 0.3
    speckled = torch.where(hit, clip.clamp_min(0.3), clip)
    reward, judge = build_reward("moving_digit"), build_reward("moving_digit_judge")
    clean, noisy = reward(clip, ["a 3 moving left"]).scores, reward(speckled, ["a 3 moving left"])
    assert clean["tidy"].item() == pytest.approx(1.0)
    assert noisy.scores["tidy"].item() < 0.7
    assert noisy.scores["moving_digit"].item() < clean["moving_digit"].item() - 0.2
    assert judge(clip, ["a 3 moving left"]).scores["speckle"].item() == 0.0
    assert judge(speckled, ["a 3 moving left"]).scores["speckle"].item() > 0.2
    alone = torch.where(hit[0, :, 0, :8, :8], 0.3, 0.0)[:, None]  # [6, 1, 8, 8] speckle windows
    assert (load_video_classifier()(alone).argmax(-1) == NO_DIGIT).all()


def test_judge_reads_a_real_digit_anywhere_on_the_frame() -> None:
    pytest.importorskip("sklearn")
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = torch.tensor(digits.images[:200], dtype=torch.float32) / 16.0
    frames = torch.zeros(200, 1, 16, 16)
    frames[:100, 0, 1:9, 7:15] = images[:100]
    frames[100:, 0, 8:16, 0:8] = images[100:]
    judge = MovingDigitJudge()
    assert isinstance(judge.model, FrameDigitJudge)
    accuracy = (judge.model(frames).argmax(-1) == torch.tensor(digits.target[:200])).float()
    assert accuracy.mean() > 0.85


def test_reward_refuses_images() -> None:
    with pytest.raises(ValueError, match="videos"):
        build_reward("moving_digit")(torch.zeros(2, 1, 16, 16), ["a 3 moving left"] * 2)
