"""The JSON wire format of reward servers (``reward_models/server.py``, ``remote.py``).

JSON only: no pickle, so a server never executes what a client sends. Images travel as
base64-encoded 8-bit PNGs (lossless for 8-bit data; a float image in ``[0, 1]`` is rounded to
the nearest of 256 levels, at most 0.002 away), texts as strings. NaN scores ("not
applicable") travel as ``null``.

Request (``POST /score``)::

    {"version": 1, "prompts": [str], "outputs": {"images": [b64 PNG]} | {"texts": [str]},
     "metadata": [object] | null}

Response: ``{"version": 1, "reward": NAME, "scores": {name: [float | null]},
"applicable": {name: [bool]}}``; errors: ``{"error": message}`` with a 4xx/5xx status.
"""

from __future__ import annotations

import base64
import io
import math
from typing import Any

import torch

VERSION = 1


class WireError(ValueError):
    """A request or response that does not follow the wire format."""


def encode_outputs(outputs: Any) -> dict[str, list[str]]:
    """Images ``[B, C, H, W]`` in ``[0, 1]`` (C = 1 or 3) or a list of texts."""
    if isinstance(outputs, torch.Tensor):
        if outputs.ndim != 4 or outputs.shape[1] not in (1, 3):
            raise WireError(f"images must be [B, 1 or 3, H, W], got {tuple(outputs.shape)}")
        return {"images": [_png(image) for image in quantize(outputs)]}
    if isinstance(outputs, list | tuple) and all(isinstance(t, str) for t in outputs):
        return {"texts": list(outputs)}
    raise WireError(f"outputs must be an image tensor or a list of strings, got {type(outputs)}")


def decode_outputs(payload: Any, max_pixels: int = 64 * 1024 * 1024) -> torch.Tensor | list[str]:
    """Inverse of ``encode_outputs``: float32 images in ``[0, 1]`` or texts. Images holding more
    than ``max_pixels`` pixels together are refused from their headers, before decoding."""
    if not isinstance(payload, dict) or len(payload) != 1:
        raise WireError('"outputs" must be {"images": [...]} or {"texts": [...]}')
    if "texts" in payload:
        texts = payload["texts"]
        if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
            raise WireError('"texts" must be a list of strings')
        return texts
    images = payload.get("images")
    if not isinstance(images, list) or not images:
        raise WireError('"images" must be a non-empty list of base64 PNG strings')
    budget = [max_pixels]
    tensors = [_unpng(item, i, budget) for i, item in enumerate(images)]
    shapes = {tuple(t.shape) for t in tensors}
    if len(shapes) > 1:
        raise WireError(f"images of one request must share a size, got {sorted(shapes)}")
    return torch.stack(tensors)


def quantize(images: torch.Tensor) -> torch.Tensor:
    """``[B, C, H, W]`` float in ``[0, 1]`` -> uint8, as the wire sends it."""
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


def _unpng(item: Any, index: int, budget: list[int]) -> torch.Tensor:
    import numpy as np
    from PIL import Image

    if not isinstance(item, str):
        raise WireError(f"image {index} is not a base64 string")
    try:
        picture = Image.open(io.BytesIO(base64.b64decode(item, validate=True)))
    except Exception as err:  # binascii.Error, PIL.UnidentifiedImageError
        raise WireError(f"image {index} is not a base64-encoded PNG: {err}") from err
    width, height = picture.size  # from the header: nothing is decoded yet
    budget[0] -= width * height
    if budget[0] < 0:
        raise WireError(f"image {index} ({width}x{height}) exceeds the request's pixel limit")
    try:
        picture.load()
    except Exception as err:  # truncated or corrupt data
        raise WireError(f"image {index} is not a valid PNG: {err}") from err
    if picture.mode not in ("L", "RGB"):
        picture = picture.convert("RGB")
    array = np.asarray(picture, dtype=np.uint8)
    tensor = torch.from_numpy(array.copy()).float() / 255
    return tensor[None] if tensor.ndim == 2 else tensor.permute(2, 0, 1)


__all__ = [
    "VERSION",
    "WireError",
    "decode_outputs",
    "decode_scores",
    "encode_outputs",
    "encode_scores",
    "quantize",
]
