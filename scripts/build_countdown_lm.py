"""Pretrain the embedded Countdown LM deterministically and write it to ``genrl/assets/countdown_lm``.

    python scripts/build_countdown_lm.py              # train, write model + tokenizer + manifest
    python scripts/build_countdown_lm.py --check      # verify shipped files against the manifest
    python scripts/build_countdown_lm.py --reproduce  # rebuild in a temp dir, compare sha256s

A tiny Qwen3 over a character-level tokenizer, fine-tuned on ``prompt + solution + <eos>`` from
the train split of ``tasks.countdown`` (loss on completion tokens only). It is left weak so
GRPO has headroom: training stops at ``TRAIN["stop_step"]``, about half-way through the schedule
planned over ``TRAIN["steps"]`` (the shapes VLM's early stop). Run to the end, the same training
reaches 0.525 held-out greedy accuracy, so the stopped model is short of what this architecture
learns from these problems rather than wrong by construction. The build fails unless the
held-out metrics land in ``ACCEPT``. One thread,
deterministic kernels, explicit generators: identical bits on the same machine and torch build.
"""

from __future__ import annotations

import inspect
import math
import random
import sys
import time
from itertools import combinations_with_replacement
from pathlib import Path
from typing import Any

import torch

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

import asset_tools

from tasks import countdown

OUT_DIR = REPO_ROOT / "genrl" / "assets" / "countdown_lm"
COMMAND = "python scripts/build_countdown_lm.py"
SPECIAL_TOKENS = ["<pad>", "<eos>", "<unk>"]  # ids 0, 1, 2
CHARACTERS = "0123456789+-*/() :Usetomak"  # equations, spaces and the prompt's words

# 128 wide and 4 deep (792k parameters; the model until 2026-12-03 was 96 x 3, 308k): GRPO from
# the larger model gains more held-out accuracy (docs/algorithms/grpo.md), and heads of 32
# dimensions are what vLLM's CPU attention kernel needs, so the engine lane can run it.
MODEL = {
    "hidden_size": 128,
    "intermediate_size": 384,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "max_position_embeddings": 64,
    "tie_word_embeddings": True,
}

TRAIN = {
    "seed": 0,
    # The learning-rate schedule is planned over ``steps``; training stops at ``stop_step``.
    "steps": 1500,
    "stop_step": 800,
    "batch_size": 64,
    "lr": 3e-3,
    "warmup_steps": 100,
    "schedule": "linear warmup, cosine decay to 10%",
    "weight_decay": 0.01,
    "optimizer": "AdamW",
    # Fraction of completions replaced by a wrong equation over the same numbers. The model
    # shipped until 2026-12-03 used 0.1 and ran all 1500 steps (held-out greedy 0.37): GRPO
    # gained +0.09 to +0.11 on it, flat after ~50 iterations, while from the early-stopped
    # clean model it gains more (docs/algorithms/grpo.md). A draw is still taken per example, so
    # the data order does not depend on this value.
    "label_noise": 0.0,
    "data": "all train problems; each draw shuffles the numbers and picks a solution uniformly",
}

EVAL = {
    "problems": 200,
    "problem_seed": 0,
    "samples": 8,
    "temperature": 1.0,
    "sample_seed": 1234,
    "max_new_tokens": countdown.MAX_COMPLETION_CHARS + 1,
}

# The build fails unless the held-out metrics land here: weak but trainable.
ACCEPT = {"heldout_greedy_accuracy": [0.2, 0.7], "min_pass8_minus_pass1": 0.2}


def build_tokenizer() -> Any:
    """Character-level WordLevel tokenizer; decoding fuses characters back without spaces."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {token: i for i, token in enumerate(SPECIAL_TOKENS + sorted(set(CHARACTERS)))}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    backend.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        **dict(zip(("pad_token", "eos_token", "unk_token"), SPECIAL_TOKENS, strict=True)),
        padding_side="left",
        model_max_length=MODEL["max_position_embeddings"],
    )


def build_model(vocab_size: int) -> Any:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(
        vocab_size=vocab_size, pad_token_id=0, eos_token_id=1, bos_token_id=None, **MODEL
    )
    torch.manual_seed(TRAIN["seed"])
    return Qwen3ForCausalLM(config)


def train_problems() -> list[tuple[tuple[int, ...], int, list[str], list[str]]]:
    """Every train-split (sorted numbers, target, solutions, wrong equations), in a fixed order."""
    (n_low, n_high), (t_low, t_high) = countdown.NUMBER_RANGE, countdown.TARGET_RANGE
    items = []
    for numbers in combinations_with_replacement(range(n_low, n_high + 1), 3):
        exprs = countdown.expressions(numbers)
        for target in sorted({v for _, v in exprs if t_low <= v <= t_high}):
            if countdown.split_of(numbers, target) == "train":
                good = [e for e, v in exprs if v == target]
                items.append((numbers, target, good, [e for e, v in exprs if v != target]))
    return items


def positions(mask: torch.Tensor) -> torch.Tensor:
    """Position ids that ignore left padding."""
    return (mask.cumsum(-1) - 1).clamp(min=0)


def train(model: Any, tokenizer: Any) -> dict[str, Any]:
    cfg, rng = TRAIN, random.Random(TRAIN["seed"])
    items = train_problems()
    opt = torch.optim.AdamW(model.parameters(), lr=cfg["lr"], weight_decay=cfg["weight_decay"])

    def lr_factor(step: int) -> float:
        warm, progress = cfg["warmup_steps"], max(0, step - cfg["warmup_steps"])
        cosine = 0.1 + 0.45 * (1 + math.cos(math.pi * (progress / max(1, cfg["steps"] - warm))))
        return min(1.0, (step + 1) / warm) * cosine

    scheduler = torch.optim.lr_scheduler.LambdaLR(opt, lr_factor)
    model.train()
    losses: list[float] = []
    for step in range(cfg["stop_step"]):
        texts, completion_lengths = [], []
        for numbers, target, good, bad in rng.choices(items, k=cfg["batch_size"]):
            shuffled = list(numbers)
            rng.shuffle(shuffled)
            completion = rng.choice(bad if rng.random() < cfg["label_noise"] else good)
            texts.append(countdown.format_prompt(shuffled, target) + completion + "<eos>")
            completion_lengths.append(len(completion) + 1)
        batch = tokenizer(texts, padding=True, return_tensors="pt")
        ids, mask = batch["input_ids"], batch["attention_mask"]
        width = ids.shape[1]
        first = torch.tensor([width - n for n in completion_lengths])[:, None]
        labels = torch.where(torch.arange(width)[None, :] >= first, ids, -100)
        out = model(input_ids=ids, attention_mask=mask, position_ids=positions(mask), labels=labels)
        opt.zero_grad(set_to_none=True)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        scheduler.step()
        losses.append(out.loss.item())
        if (step + 1) % 250 == 0:
            print(f"  step {step + 1:5d}  loss {sum(losses[-250:]) / 250:.4f}", flush=True)
    model.eval()
    return {"train_problems": len(items), "final_train_loss": round(sum(losses[-100:]) / 100, 6)}


@torch.no_grad()
def generate(
    model: Any,
    tokenizer: Any,
    prompts: list[str],
    temperature: float,
    max_new_tokens: int,
    generator: torch.Generator | None = None,
) -> list[str]:
    """Batched sampling (temperature 0 = greedy) with a KV cache; text up to the first <eos>."""
    batch = tokenizer(prompts, padding=True, return_tensors="pt")
    ids, mask = batch["input_ids"], batch["attention_mask"]
    pos = positions(mask)
    # transformers 5 renamed ``past_key_values`` to ``cache``; accept either.
    key = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    out = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True)
    cache, next_pos, logits = getattr(out, key), pos[:, -1:] + 1, out.logits[:, -1]
    tokens = []
    for _ in range(max_new_tokens):
        if temperature == 0:
            token = logits.argmax(-1, keepdim=True)
        else:
            probs = torch.softmax(logits.float() / temperature, -1)
            token = torch.multinomial(probs, 1, generator=generator)
        tokens.append(token)
        mask = torch.cat([mask, torch.ones_like(token)], dim=1)
        kwargs = {"attention_mask": mask, "position_ids": next_pos, "use_cache": True, key: cache}
        out = model(input_ids=token, **kwargs)
        cache, next_pos, logits = getattr(out, key), next_pos + 1, out.logits[:, -1]
    eos, rows = tokenizer.eos_token_id, torch.cat(tokens, dim=1).tolist()
    return [tokenizer.decode(row[: row.index(eos)] if eos in row else row) for row in rows]


def evaluate(model: Any, tokenizer: Any, split: str = "heldout") -> dict[str, float]:
    """Greedy accuracy, sampled pass@1 (mean over samples) and pass@k on ``EVAL`` problems."""
    cfg, k = EVAL, EVAL["samples"]
    problems = countdown.make_problems(cfg["problems"], cfg["problem_seed"], split)
    prompts, new = [p.prompt for p in problems], cfg["max_new_tokens"]
    greedy = generate(model, tokenizer, prompts, 0.0, new)
    repeated = [p for p in prompts for _ in range(k)]
    generator = torch.Generator().manual_seed(cfg["sample_seed"])
    samples = generate(model, tokenizer, repeated, cfg["temperature"], new, generator)
    rewards = torch.tensor(countdown.countdown_reward(repeated, samples))
    correct = (rewards == countdown.CORRECT_REWARD).view(-1, k)
    greedy_rewards = torch.tensor(countdown.countdown_reward(prompts, greedy))
    metrics = {
        "greedy_accuracy": (greedy_rewards == countdown.CORRECT_REWARD).float().mean(),
        "pass1": correct.float().mean(),
        f"pass{k}": correct.any(1).float().mean(),
        "mean_reward": rewards.mean(),
        "well_formed_rate": (rewards > 0).float().mean(),
    }
    return {name: round(value.item(), 6) for name, value in metrics.items()}


def build(out: Path) -> dict[str, Any]:
    start = time.perf_counter()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    tokenizer = build_tokenizer()
    model = build_model(len(tokenizer))
    params = sum(p.numel() for p in model.parameters())
    print(
        f"model: {params} parameters; training {TRAIN['stop_step']} of {TRAIN['steps']} steps ...",
        flush=True,
    )
    train_metrics = train(model, tokenizer)
    train_metrics["train_seconds"] = round(time.perf_counter() - start, 1)
    heldout = evaluate(model, tokenizer, "heldout")
    train_eval = evaluate(model, tokenizer, "train")
    print(f"held-out: {heldout}\ntrain:    {train_eval}")
    gap = heldout[f"pass{EVAL['samples']}"] - heldout["pass1"]
    low, high = ACCEPT["heldout_greedy_accuracy"]
    if not low <= heldout["greedy_accuracy"] <= high or gap < ACCEPT["min_pass8_minus_pass1"]:
        raise RuntimeError(f"held-out metrics {heldout} miss {ACCEPT}: adjust TRAIN or MODEL")
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    files = sorted(asset_tools.file_entries(out))
    manifest = {
        "description": "Tiny Qwen3 LM for tasks.countdown; char-level tokenizer, left padding",
        "command": COMMAND,
        "format": "prompt + completion + <eos>, e.g. 'Use 3 5 7 to make 22:' + '3*5+7' + '<eos>'",
        "special_tokens": {t: i for i, t in enumerate(SPECIAL_TOKENS)},
        "task": {"numbers": countdown.NUMBER_RANGE, "targets": countdown.TARGET_RANGE},
        "model": {**MODEL, "vocab_size": len(tokenizer), "parameters": params},
        "training": TRAIN,
        "eval": EVAL,
        "accept": ACCEPT,
        "metrics": {**train_metrics, "heldout": heldout, "train": train_eval},
        "torch_version": torch.__version__,
        "files": asset_tools.file_entries(out),
    }
    asset_tools.write_manifest(out, manifest)
    print(f"wrote {out}: {files}; total {time.perf_counter() - start:.1f} s")
    return manifest


def main(argv: list[str] | None = None) -> int:
    return asset_tools.main(argv, __doc__.split("\n", 1)[0], OUT_DIR, COMMAND, build)


if __name__ == "__main__":
    sys.exit(main())
