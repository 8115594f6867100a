"""How a masked-diffusion LM's completion is revealed step by step (``samplers/masked.py``
samples it), without torch, so that a config's steps and block length are checked before the
command line imports torch."""

from __future__ import annotations


def tokens_per_step(num_masked: int, steps: int) -> list[int]:
    """How many tokens each of ``steps`` steps reveals: as even as possible, the remainder on
    the first steps (LLaDA's schedule for a linear noise schedule)."""
    if steps < 1 or steps > num_masked:
        raise ValueError(
            f"steps must lie in [1, {num_masked}] for {num_masked} tokens, got {steps}"
        )
    base, extra = divmod(num_masked, steps)
    return [base + (1 if i < extra else 0) for i in range(steps)]


def unmasking_schedule(
    steps: int, block_length: int | None, length: int
) -> list[tuple[int, int, int]]:
    """``(block start, block end, tokens to reveal)`` for every step of ``steps`` over a
    completion of ``length`` tokens in blocks of ``block_length`` (None: one block)."""
    block = block_length or length
    if length % block:
        raise ValueError(f"completion length {length} is not a multiple of block_length {block}")
    num_blocks = length // block
    if steps % num_blocks:
        raise ValueError(f"steps ({steps}) must divide evenly over {num_blocks} blocks")
    per_block = steps // num_blocks
    return [
        (b * block, (b + 1) * block, k)
        for b in range(num_blocks)
        for k in tokens_per_step(block, per_block)
    ]
