"""Token sampling for autoregressive models: temperature, top-k, top-p, with log-probs.

The log-prob recorded for a sampled token is ``log_softmax(logits / temperature)`` over the
whole vocabulary, the density that training re-computes from a forward pass (TRL's and verl's
convention). Top-k/top-p only restrict which tokens can be drawn; they are not part of the
scored density, so keep them at their defaults (off) when exact on-policy ratios matter.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

# Logits per chunk of ``selected_log_probs`` (64 MiB in float32) when that is more than 4 rows.
CHUNK_ELEMENTS = 2**24


def default_rows_per_chunk(shape: tuple[int, ...] | torch.Size) -> int:
    """Rows of ``[B, T, V]`` logits that ``selected_log_probs`` scores at once: 4, or as many
    as hold ``CHUNK_ELEMENTS`` logits."""
    return max(4, CHUNK_ELEMENTS // max(1, shape[1] * shape[2]))


def selected_log_probs(
    logits: torch.Tensor,
    targets: torch.Tensor,
    temperature: float = 1.0,
    rows_per_chunk: int | None = None,
) -> torch.Tensor:
    """``log_softmax(logits / T)`` at ``targets`` only, ``[B, T]`` from ``[B, T, V]`` logits
    (temperature 0, greedy decoding, is scored at 1), a few rows at a time: a float32
    ``[B, T, V]`` copy of a 150k-token vocabulary would cost gigabytes for a minibatch of long
    answers. ``rows_per_chunk`` defaults to 4 rows, or to as many as hold ``CHUNK_ELEMENTS``
    logits when rows are small (a small vocabulary is scored in one piece instead of a Python
    loop over 4-row slices). Each row's values do not depend on the chunking."""
    if rows_per_chunk is None:
        rows_per_chunk = default_rows_per_chunk(logits.shape)
    scale = temperature if temperature > 0 else 1.0
    chunks = []
    for start in range(0, logits.shape[0], rows_per_chunk):
        part = logits[start : start + rows_per_chunk].float() / scale
        chosen = part.gather(-1, targets[start : start + rows_per_chunk, :, None]).squeeze(-1)
        chunks.append(chosen - part.logsumexp(dim=-1))
    return torch.cat(chunks)


def selected_log_probs_and_entropies(
    logits: torch.Tensor,
    targets: torch.Tensor,
    temperature: float = 1.0,
    rows_per_chunk: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``selected_log_probs`` and, from the same logits, the entropy of each position's whole
    distribution ``H_t = -sum_v p_v log p_v`` with ``p = softmax(logits / T)``: both ``[B, T]``
    float32 from ``[B, T, V]`` logits, chunked the same way (the entropy needs the normalised
    distribution that the log-prob already computes, so it costs one more pass over ``V``)."""
    if rows_per_chunk is None:
        rows_per_chunk = default_rows_per_chunk(logits.shape)
    scale = temperature if temperature > 0 else 1.0
    chosen_chunks, entropy_chunks = [], []
    for start in range(0, logits.shape[0], rows_per_chunk):
        part = logits[start : start + rows_per_chunk].float() / scale
        normaliser = part.logsumexp(dim=-1)
        chosen = part.gather(-1, targets[start : start + rows_per_chunk, :, None]).squeeze(-1)
        # The same operations as ``selected_log_probs``, so that these log-probs equal
        # training's recomputation bit for bit (the first update's ratio is exactly 1).
        chosen_chunks.append(chosen - normaliser)
        log_p = part - normaliser[..., None]
        # A token ruled out by a -inf logit (a VLM's vision placeholders) adds 0, not 0 * -inf.
        probs = log_p.exp()
        entropy_chunks.append(-torch.where(probs > 0, probs * log_p, 0.0).sum(dim=-1))
    return torch.cat(chosen_chunks), torch.cat(entropy_chunks)


@dataclass
class TokenStep:
    """One sampled token per row: ``tokens [B]`` long and their ``log_probs [B]`` float32."""

    tokens: torch.Tensor
    log_probs: torch.Tensor


class TokenSampler:
    """Draw the next token from logits.

    Args:
        temperature: softmax temperature; 0 means greedy (argmax), scored at temperature 1.
        top_k: keep the ``k`` most likely tokens (0 = all).
        top_p: keep the smallest set of tokens whose probability reaches ``top_p`` (1 = all;
            Holtzman et al. 2020, nucleus sampling).
    """

    def __init__(self, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0) -> None:
        if temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {temperature}")
        if top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {top_k}")
        if not 0 < top_p <= 1:
            raise ValueError(f"top_p must lie in (0, 1], got {top_p}")
        self.temperature = float(temperature)
        self.top_k = int(top_k)
        self.top_p = float(top_p)

    def log_probs(self, logits: torch.Tensor) -> torch.Tensor:
        """``log_softmax(logits / temperature)`` in float32, ``[..., V]``."""
        scale = self.temperature if self.temperature > 0 else 1.0
        return torch.log_softmax(logits.float() / scale, dim=-1)

    def selected_log_probs(
        self, logits: torch.Tensor, targets: torch.Tensor, rows_per_chunk: int | None = None
    ) -> torch.Tensor:
        """``selected_log_probs`` at this sampler's temperature."""
        return selected_log_probs(logits, targets, self.temperature, rows_per_chunk)

    def step(self, logits: torch.Tensor, generator: torch.Generator | None = None) -> TokenStep:
        """Sample one token per row of ``logits [B, V]``."""
        log_probs = self.log_probs(logits)
        if self.temperature == 0:
            tokens = log_probs.argmax(dim=-1)
        else:
            tokens = torch.multinomial(self._truncate(log_probs).exp(), 1, generator=generator)
            tokens = tokens.squeeze(1)
        return TokenStep(tokens=tokens, log_probs=log_probs.gather(1, tokens[:, None]).squeeze(1))

    def _truncate(self, log_probs: torch.Tensor) -> torch.Tensor:
        """Set the log-probs of tokens outside top-k / top-p to -inf."""
        if self.top_k and self.top_k < log_probs.shape[-1]:
            kth = log_probs.topk(self.top_k, dim=-1).values[:, -1:]
            log_probs = log_probs.masked_fill(log_probs < kth, float("-inf"))
            # Nucleus mass is measured on the top-k distribution, as transformers does.
            log_probs = log_probs - log_probs.logsumexp(dim=-1, keepdim=True)
        if self.top_p < 1:
            sorted_lp, order = log_probs.sort(dim=-1, descending=True)
            cumulative = sorted_lp.exp().cumsum(dim=-1)
            # Drop a token when the tokens before it already reach top_p (the first always stays).
            drop_sorted = (cumulative - sorted_lp.exp()) >= self.top_p
            drop = torch.zeros_like(drop_sorted).scatter(1, order, drop_sorted)
            log_probs = log_probs.masked_fill(drop, float("-inf"))
        return log_probs


@dataclass
class Generation:
    """Output of ``generate``.

    Attributes:
        tokens: ``[B, T]`` generated ids, ``pad_token_id`` after a row finished.
        log_probs: ``[B, T]`` sampling log-probs (0 after a row finished).
        mask: ``[B, T]`` bool, True on generated tokens up to and including the end token.
        finished: ``[B]`` bool, True where the row produced the end token (else truncated).
    """

    tokens: torch.Tensor
    log_probs: torch.Tensor
    mask: torch.Tensor
    finished: torch.Tensor


# (input_ids [B, n], position_ids [B, n], attention_mask [B, total], cache) -> (logits [B, V], cache)
NextTokenLogits = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, object], tuple[torch.Tensor, object]
]


@torch.no_grad()
def generate(
    next_logits: NextTokenLogits,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    sampler: TokenSampler,
    max_new_tokens: int,
    eos_token_ids: list[int],
    pad_token_id: int,
    generator: torch.Generator | None = None,
    lockstep: bool = False,
) -> Generation:
    """Batched sampling with a key-value cache until every row ends or ``max_new_tokens``.

    Args:
        next_logits: the model call (see ``NextTokenLogits``); the cache object is opaque here.
        prompt_ids, prompt_mask: ``[B, P]`` left-padded prompts and their attention mask.
        eos_token_ids: ids that end a row (the end token itself is kept and trained on).
        lockstep: call ``next_logits`` ``max_new_tokens`` times even after every row ended
            (their results are dropped; the output is the same): a sharded model's forward is a
            collective, and every process must make the same number of them.
    """
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    batch, device = prompt_ids.shape[0], prompt_ids.device
    attention = prompt_mask.long()
    # Left padding: positions count real tokens only, as the scoring forward does.
    positions = (attention.cumsum(-1) - 1).clamp(min=0)
    eos = torch.tensor(eos_token_ids, device=device)
    finished = torch.zeros(batch, dtype=torch.bool, device=device)
    tokens, log_probs, masks = [], [], []
    logits, cache = next_logits(prompt_ids, positions, attention, None)
    next_position = positions[:, -1:] + 1
    for _ in range(max_new_tokens):
        step = sampler.step(logits, generator)
        alive = ~finished
        tokens.append(torch.where(alive, step.tokens, torch.full_like(step.tokens, pad_token_id)))
        log_probs.append(torch.where(alive, step.log_probs, torch.zeros_like(step.log_probs)))
        masks.append(alive)
        finished = finished | (alive & torch.isin(step.tokens, eos))
        if bool(finished.all()):
            for _ in range(max_new_tokens - len(tokens) + 1 if lockstep else 0):
                attention = torch.cat([attention, torch.zeros_like(attention[:, :1])], dim=1)
                _, cache = next_logits(tokens[-1][:, None], next_position, attention, cache)
                next_position = next_position + 1
            break
        attention = torch.cat([attention, alive[:, None].long()], dim=1)
        logits, cache = next_logits(tokens[-1][:, None], next_position, attention, cache)
        next_position = next_position + 1
    return Generation(
        tokens=torch.stack(tokens, dim=1),
        log_probs=torch.stack(log_probs, dim=1),
        mask=torch.stack(masks, dim=1),
        finished=finished,
    )
