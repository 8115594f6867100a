"""Video samples a person can look at: the animated grid, the frame strip, before | after, and
pictures in TensorBoard."""

from __future__ import annotations

from pathlib import Path

import torch
from PIL import Image

from genrl.reporting.metrics import MetricsWriter
from genrl.reporting.pictures import save_side_by_side, save_video_samples

PROMPTS = ["a 3 moving right", "a 1 moving left"] * 3  # 2 prompts x 3 samples


def moving_dot(frames: int = 4) -> torch.Tensor:
    """``[6, F, 1, 8, 8]``: a white dot one pixel further right in every frame."""
    videos = torch.zeros(6, frames, 1, 8, 8)
    for f in range(frames):
        videos[:, f, 0, 4, 2 + f] = 1.0
    return videos


def test_videos_become_an_animated_grid_and_a_frame_strip(tmp_path: Path) -> None:
    gif, strip = tmp_path / "s.gif", tmp_path / "s.png"
    save_video_samples(moving_dot(), PROMPTS, gif, strip, num_prompts=2, per_prompt=3, cell=16)
    with Image.open(gif) as animation:
        assert animation.n_frames == 4 and animation.info["duration"] == 250
        # Row 1, first sample (label 200 px, gap 4): the dot of frame k sits in column 2 + k.
        for k in range(4):
            animation.seek(k)
            cell = animation.convert("L").crop((200, 4, 216, 20))
            bright = [x for x in range(16) if cell.getpixel((x, 8)) > 128]
            assert bright == [2 * (2 + k), 2 * (2 + k) + 1]  # 8 px upscaled 2x
    with Image.open(strip) as picture:  # 2 rows (prompts) x 4 columns (frames)
        assert picture.size == (200 + 4 * (16 + 4), 2 * (16 + 4) + 4)


def test_before_and_after_gifs_play_side_by_side(tmp_path: Path) -> None:
    for name, videos in (("before", moving_dot()), ("after", moving_dot().flip(-1))):
        save_video_samples(
            videos, PROMPTS, tmp_path / f"{name}.gif", tmp_path / f"{name}.png", num_prompts=2
        )
    both = tmp_path / "both.gif"
    save_side_by_side(tmp_path / "before.gif", tmp_path / "after.gif", both, ("b", "a"))
    with Image.open(both) as animation, Image.open(tmp_path / "before.gif") as before:
        assert animation.n_frames == 4
        assert animation.size[0] == 2 * before.size[0] + 16


def test_pictures_reach_tensorboard(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    save_video_samples(moving_dot(), PROMPTS, tmp_path / "s.gif", tmp_path / "s.png", num_prompts=2)
    writer = MetricsWriter(tmp_path, tensorboard=True)
    writer.add_picture("samples/after", tmp_path / "s.gif", 7)
    writer.close()
    events = EventAccumulator(str(tmp_path / "tensorboard"), size_guidance={"images": 0})
    events.Reload()
    (image,) = events.Images("samples/after")
    assert image.step == 7
    assert image.encoded_image_string == (tmp_path / "s.gif").read_bytes()


def test_a_still_before_video_keeps_every_frame_of_after(tmp_path: Path) -> None:
    """A still clip's GIF is one long frame (identical frames are merged); before | after is
    paired by time, so the moving "after" keeps all its frames."""
    still = torch.zeros(6, 4, 1, 8, 8)
    still[:, :, 0, 4, 4] = 1.0
    save_video_samples(still, PROMPTS, tmp_path / "b.gif", tmp_path / "b.png", num_prompts=2)
    save_video_samples(moving_dot(), PROMPTS, tmp_path / "a.gif", tmp_path / "a.png", num_prompts=2)
    with Image.open(tmp_path / "b.gif") as before:
        assert before.n_frames == 1  # merged by the GIF writer
    both = tmp_path / "both.gif"
    save_side_by_side(tmp_path / "b.gif", tmp_path / "a.gif", both, ("before", "after"))
    with Image.open(both) as animation:
        assert animation.n_frames == 4
