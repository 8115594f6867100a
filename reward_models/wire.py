"""The JSON wire format of reward servers (``reward_models/serving/server.py``, ``remote.py``).

JSON only: no pickle, so a server never executes what a client sends. Images travel as
base64-encoded 8-bit PNGs (lossless for 8-bit data; a float image in ``[0, 1]`` is rounded to
the nearest of 256 levels, at most 0.002 away), videos as one list of PNG frames per video, texts as strings. NaN scores ("not
applicable") travel as ``null``. PNG is the one image encoding: other bytes (JPEG, GIF, ...,
16-bit PNG) are refused as ``UnsupportedFormat`` from their signature, and only PIL's PNG
plugin reads what a client sends.

Request (``POST /score``)::

    {"version": 1, "prompts": [str],
     "outputs": {"images": [b64 PNG]} | {"videos": [[b64 PNG]]} | {"texts": [str]},
     "metadata": [object] | null}

Response: ``{"version": 1, "reward": NAME, "scores": {name: [float | null]},
"applicable": {name: [bool]}}``; errors: ``{"error": message, "request_id": id}`` with a 4xx/5xx
status (docs/rewards.md lists them).
"""

from __future__ import annotations

import base64
import io
import math
from typing import Any

import torch

from reward_models.base import OUTPUT_KINDS

VERSION = 1
KINDS = OUTPUT_KINDS  # the keys of "outputs", one per kind of reward input
IMAGE_FORMATS = ("PNG",)  # PIL format names of the image encodings the wire carries
ACCEPTED_IMAGES = "base64-encoded 8-bit PNG images (grayscale or RGB; palette or alpha: to RGB)"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
# Signatures of encodings a client may send by mistake, to name them in the refusal.
_OTHER_MAGIC = (
    (b"\xff\xd8\xff", "JPEG"),
    (b"GIF8", "GIF"),
    (b"BM", "BMP"),
    (b"II*\x00", "TIFF"),
    (b"MM\x00*", "TIFF"),
    (b"RIFF", "RIFF file (WebP?)"),
)
# PNG modes PIL opens for 8-bit (or fewer bits) data; 16-bit PNGs open as "I;16" or "I".
_EIGHT_BIT_MODES = frozenset({"1", "L", "LA", "P", "PA", "RGB", "RGBA"})


class WireError(ValueError):
    """A request or response that does not follow the wire format."""


class UnsupportedFormat(WireError):
    """An output in an encoding the wire format does not carry (a server answers 415)."""


def encode_outputs(outputs: Any) -> dict[str, Any]:
    """Images ``[B, C, H, W]`` or videos ``[B, F, C, H, W]`` in ``[0, 1]`` (C = 1 or 3), or a
    list of texts."""
    if isinstance(outputs, torch.Tensor):
        if outputs.ndim == 5 and outputs.shape[2] in (1, 3):
            return {"videos": [[_png(frame) for frame in video] for video in quantize(outputs)]}
        if outputs.ndim != 4 or outputs.shape[1] not in (1, 3):
            raise WireError(
                "images must be [B, 1 or 3, H, W] and videos [B, F, 1 or 3, H, W], "
                f"got {tuple(outputs.shape)}"
            )
        return {"images": [_png(image) for image in quantize(outputs)]}
    if isinstance(outputs, list | tuple) and all(isinstance(t, str) for t in outputs):
        return {"texts": list(outputs)}
    raise WireError(f"outputs must be an image tensor or a list of strings, got {type(outputs)}")


def output_kind(payload: Any) -> str:
    """``"images"``, ``"videos"`` or ``"texts"``: the one key of a request's ``outputs``."""
    if not isinstance(payload, dict) or len(payload) != 1 or next(iter(payload)) not in KINDS:
        raise WireError(
            '"outputs" must be {"images": [...]}, {"videos": [...]} or {"texts": [...]}'
        )
    return next(iter(payload))


def open_videos(payload: Any, max_pixels: int) -> tuple[list[Any], int]:
    """The frames of a ``{"videos": [[...], ...]}`` payload opened as ``open_images`` opens
    images (every frame of every video counts against ``max_pixels``), flattened video by
    video, and the number of frames per video (equal for all)."""
    videos = payload.get("videos") if isinstance(payload, dict) else None
    if (
        not isinstance(videos, list)
        or not videos
        or not all(isinstance(v, list) and v for v in videos)
    ):
        raise WireError('"videos" must be a non-empty list of non-empty lists of base64 PNGs')
    frames = {len(v) for v in videos}
    if len(frames) > 1:
        raise WireError(f"videos of one request must have the same frame count, got {frames}")
    flat = [frame for video in videos for frame in video]
    return open_images({"images": flat}, max_pixels), frames.pop()


def decode_texts(payload: Any) -> list[str]:
    texts = payload.get("texts") if isinstance(payload, dict) else None
    if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
        raise WireError('"texts" must be a list of strings')
    return texts


def open_images(payload: Any, max_pixels: int) -> list[Any]:
    """The PIL images of an ``{"images": [...]}`` payload, opened from their headers only: the
    format (PNG, 8 bits) and sizes are checked and the pixels counted before anything is
    decoded, since a small PNG can decode to a huge image. More than ``max_pixels`` pixels
    together is refused."""
    images = payload.get("images") if isinstance(payload, dict) else None
    if not isinstance(images, list) or not images:
        raise WireError('"images" must be a non-empty list of base64 PNG strings')
    pictures, left = [], max_pixels
    for index, item in enumerate(images):
        picture = _open_png(item, index)
        width, height = picture.size
        left -= width * height
        if left < 0:
            raise WireError(f"image {index} ({width}x{height}) exceeds the request's pixel limit")
        pictures.append(picture)
    shapes = {(_channels(p), p.size[1], p.size[0]) for p in pictures}
    if len(shapes) > 1:
        raise WireError(f"images of one request must share a size, got {sorted(shapes)}")
    return pictures


def image_pixels(pictures: list[Any]) -> int:
    return sum(p.size[0] * p.size[1] for p in pictures)


def decode_images(pictures: list[Any]) -> torch.Tensor:
    """Decode ``open_images``' result to float32 ``[B, C, H, W]`` in ``[0, 1]``, each image
    written straight into the output (no per-image float copies to stack) and closed at once."""
    import numpy as np

    width, height = pictures[0].size
    out = torch.empty(len(pictures), _channels(pictures[0]), height, width)
    for index, picture in enumerate(pictures):
        try:
            picture.load()
        except Exception as err:  # truncated or corrupt data
            raise WireError(f"image {index} is not a valid PNG: {err}") from err
        rgb = picture if picture.mode in ("L", "RGB") else picture.convert("RGB")
        array = np.asarray(rgb, dtype=np.uint8)  # read-only view of PIL's bytes
        target = out[index].numpy()
        np.copyto(
            target[0] if array.ndim == 2 else target,
            array if array.ndim == 2 else array.transpose(2, 0, 1),
        )
        picture.close()
        del rgb, array
    return out.div_(255)


def decode_outputs(payload: Any, max_pixels: int = 64 * 1024 * 1024) -> torch.Tensor | list[str]:
    """Inverse of ``encode_outputs``: float32 images in ``[0, 1]`` or texts. Images holding more
    than ``max_pixels`` pixels together are refused from their headers, before decoding."""
    kind = output_kind(payload)
    if kind == "texts":
        return decode_texts(payload)
    if kind == "videos":
        pictures, frames = open_videos(payload, max_pixels)
        return as_videos(decode_images(pictures), frames)
    return decode_images(open_images(payload, max_pixels))


def as_videos(frames: torch.Tensor, per_video: int) -> torch.Tensor:
    """Decoded frames ``[B * F, C, H, W]`` -> videos ``[B, F, C, H, W]``."""
    return frames.view(-1, per_video, *frames.shape[1:])


def quantize(images: torch.Tensor) -> torch.Tensor:
    """Images (or videos) float in ``[0, 1]`` -> uint8, as the wire sends them."""
    return (images.detach().float().cpu().clamp(0, 1) * 255).round().to(torch.uint8)


def encode_scores(scores: dict[str, torch.Tensor]) -> dict[str, list[float | None]]:
    return {
        k: [None if not math.isfinite(x) else x for x in v.float().tolist()]
        for k, v in scores.items()
    }


def decode_scores(payload: Any, size: int) -> dict[str, torch.Tensor]:
    if not isinstance(payload, dict):
        raise WireError('"scores" must be an object of lists')
    scores = {}
    for name, values in payload.items():
        if not isinstance(values, list) or len(values) != size:
            raise WireError(f"score {name!r} must hold {size} values")
        scores[name] = torch.tensor(
            [math.nan if v is None else float(v) for v in values], dtype=torch.float32
        )
    return scores


def _png(image: torch.Tensor) -> str:
    from PIL import Image

    array = image.permute(1, 2, 0).numpy()
    picture = Image.fromarray(array[..., 0] if array.shape[2] == 1 else array)
    buffer = io.BytesIO()
    picture.save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def _open_png(item: Any, index: int) -> Any:
    from PIL import Image

    if not isinstance(item, str):
        raise WireError(f"image {index} is not a base64 string")
    try:
        data = base64.b64decode(item, validate=True)
    except ValueError as err:  # binascii.Error
        raise WireError(f"image {index} is not a base64-encoded PNG: {err}") from err
    if not data.startswith(PNG_MAGIC):
        found = next((name for magic, name in _OTHER_MAGIC if data.startswith(magic)), None)
        what = f"a {found}" if found else "not a PNG (no PNG signature)"
        raise UnsupportedFormat(
            f"image {index} is {what}; the wire format carries {ACCEPTED_IMAGES} only"
        )
    try:  # only PIL's PNG plugin may read it: no other decoder sees client bytes
        picture = Image.open(io.BytesIO(data), formats=list(IMAGE_FORMATS))
    except Exception as err:  # PIL.UnidentifiedImageError, corrupt header chunks
        raise WireError(f"image {index} is not a valid PNG: {err}") from err
    if picture.mode not in _EIGHT_BIT_MODES:
        raise UnsupportedFormat(
            f"image {index} is a PNG of mode {picture.mode!r}; the wire format carries "
            f"{ACCEPTED_IMAGES} only"
        )
    return picture


def picture_shape(picture: Any) -> tuple[int, int, int]:
    """(channels, height, width) of an opened image once decoded, read from its header."""
    width, height = picture.size
    return _channels(picture), height, width


def _channels(picture: Any) -> int:
    """Channels once decoded: grayscale stays one, every other mode becomes RGB."""
    return 1 if picture.mode == "L" else 3


__all__ = [
    "ACCEPTED_IMAGES",
    "IMAGE_FORMATS",
    "KINDS",
    "VERSION",
    "UnsupportedFormat",
    "WireError",
    "as_videos",
    "decode_images",
    "decode_outputs",
    "decode_scores",
    "decode_texts",
    "encode_outputs",
    "encode_scores",
    "image_pixels",
    "open_images",
    "open_videos",
    "output_kind",
    "picture_shape",
    "quantize",
]
