"""Pretrain the embedded 4x4 Sudoku masked-diffusion LM and write it to ``genrl/assets/sudoku_dllm``.

    python scripts/build_sudoku_dllm.py              # train, write model + tokenizer + manifest
    python scripts/build_sudoku_dllm.py --check      # verify shipped files against the manifest
    python scripts/build_sudoku_dllm.py --reproduce  # rebuild in a temp dir, compare sha256s

A tiny ModernBERT (bidirectional, rotary positions) over characters, trained with LLaDA's
masked-diffusion loss (Nie et al. 2025) on train-split ``prompt + solution`` pairs: t ~ U(eps, 1)
per example, each of the 16 completion tokens masked with probability t (never the prompt),
cross-entropy on masked tokens weighted by 1/t and divided by 16. No padding, no attention mask.
Left weak for RL (short training, ``label_noise``); the build fails unless the reference
sampler's held-out metrics land in ``ACCEPT``. One thread, deterministic kernels, explicit
generators: identical bits on the same machine and torch build.
"""

from __future__ import annotations

import math
import sys
import time
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

import asset_tools

from tasks import sudoku

OUT_DIR = REPO_ROOT / "genrl" / "assets" / "sudoku_dllm"
COMMAND = "python scripts/build_sudoku_dllm.py"
SPECIAL_TOKENS = ["<pad>", "<mask>", "<eos>", "<unk>"]  # ids 0, 1, 2, 3
CHARACTERS = "1234. :Sudok"  # digits, blank, separators and the prompt's word
MASK_ID = 1
TOKEN_IDS = {"pad_token_id": 0, "mask_token_id": MASK_ID, "eos_token_id": 2}  # for the config
TOKEN_IDS |= {"bos_token_id": None, "cls_token_id": None, "sep_token_id": None}  # never fed

MODEL = {"hidden_size": 96, "intermediate_size": 192, "num_hidden_layers": 3}
MODEL |= {"num_attention_heads": 4, "max_position_embeddings": 64, "tie_word_embeddings": True}

TRAIN = {"seed": 0, "steps": 400, "batch_size": 128, "optimizer": "AdamW", "weight_decay": 0.01}
TRAIN |= {"lr": 2e-3, "warmup_steps": 100, "schedule": "linear warmup, cosine decay to 10%"}
# LLaDA's t ~ U(mask_eps, 1); training puzzles' blank counts (inclusive); label_noise: fraction
# of blank cells whose target digit is uniformly random, so sampling errs and RL has headroom.
TRAIN |= {"mask_eps": 1e-3, "blanks": [9, 12], "label_noise": 0.2}
TRAIN["data"] = "fresh puzzles every step: uniform blank count, first uniquely solvable of 32 draws"

EVAL = {"problems": 200, "problem_seed": 0, "samples": 8, "temperature": 1.0, "sample_seed": 1234}
EVAL_STEPS = (16, 8)  # sampler steps: 1 and 2 tokens unmasked per step
# The build fails unless the held-out metrics (for every step count) land here.
ACCEPT = {"heldout_greedy_solved": [0.2, 0.7], "min_pass8_minus_pass1": 0.2}


def build_tokenizer() -> Any:
    """Character-level WordLevel tokenizer; decoding fuses characters back without spaces."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {token: i for i, token in enumerate(SPECIAL_TOKENS + sorted(set(CHARACTERS)))}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    backend.decoder = decoders.Fuse()
    names = ("pad_token", "mask_token", "eos_token", "unk_token")
    kwargs = dict(zip(names, SPECIAL_TOKENS, strict=True), model_max_length=64)
    return PreTrainedTokenizerFast(tokenizer_object=backend, **kwargs)


def build_model(vocab_size: int) -> Any:
    """ModernBERT with global attention in every layer; ids of absent tokens are None."""
    from transformers import ModernBertConfig, ModernBertForMaskedLM

    rope = {"rope_type": "default", "rope_theta": 10000.0}
    config = ModernBertConfig(
        vocab_size=vocab_size,
        layer_types=["full_attention"] * MODEL["num_hidden_layers"],
        rope_parameters={"full_attention": rope, "sliding_attention": dict(rope)},
        **TOKEN_IDS,
        **MODEL,
    )
    torch.manual_seed(TRAIN["seed"])
    return ModernBertForMaskedLM(config)


def one_hot(grids: torch.Tensor) -> torch.Tensor:
    """(..., 16) digits 1-4 (0 = blank) -> (..., 64) float one-hot of (cell, digit)."""
    return torch.nn.functional.one_hot(grids, 5)[..., 1:].flatten(-2).float()


@lru_cache(maxsize=1)
def solution_tables() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """All 288 grids as digits (288, 16), their one-hots (64, 288), the train-split indices."""
    grids = sudoku.solutions()
    table = torch.tensor([[int(ch) for ch in g] for g in grids])
    train = torch.tensor([i for i, g in enumerate(grids) if sudoku.split_of(g) == "train"])
    return table, one_hot(table).T, train


def sample_puzzles(n: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` train puzzles as (solution digits (m, 16), blank mask (m, 16)), m <= n, vectorised.

    Per slot: a blank count uniform in ``TRAIN["blanks"]``, 32 (solution, cells) draws, the first
    uniquely solvable kept (none: slot dropped). Uniqueness by one matmul of (cell, digit) one-hots.
    """
    (table, table_one_hot, train), (low, high), tries = solution_tables(), TRAIN["blanks"], 32
    counts = torch.randint(low, high + 1, (n, 1, 1), generator=gen)
    grids = table[train[torch.randint(len(train), (n, tries), generator=gen)]]  # (n, tries, 16)
    blank = torch.rand(n, tries, 16, generator=gen).argsort(-1).argsort(-1) < counts
    # (n, tries, 288): how many givens each grid matches; the puzzle's count means consistent.
    overlap = one_hot(torch.where(blank, 0, grids)) @ table_one_hot
    unique = (overlap == (16 - counts)).sum(-1) == 1
    found, first, rows = unique.any(-1), unique.float().argmax(-1), torch.arange(n)
    return grids[rows, first][found], blank[rows, first][found]


def encode_batch(tokenizer: Any, grids: torch.Tensor, blank: torch.Tensor) -> torch.Tensor:
    """Token ids (m, 43) of ``prompt + solution`` for digit grids and blank masks."""
    texts = []
    for grid, empty in zip(grids.tolist(), blank.tolist(), strict=True):
        solution = "".join(map(str, grid))
        puzzle = "".join("." if e else ch for ch, e in zip(solution, empty, strict=True))
        texts.append(sudoku.format_prompt(puzzle) + solution)
    return torch.tensor(tokenizer(texts)["input_ids"])


def diffusion_loss(model: Any, ids: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """LLaDA loss: mask completion tokens with prob t, CE/t on masked ones, / completion length."""
    m, start, eps = ids.shape[0], sudoku.PROMPT_CHARS, TRAIN["mask_eps"]
    t = eps + (1 - eps) * torch.rand(m, 1, generator=gen)
    masked = torch.zeros_like(ids, dtype=torch.bool)
    masked[:, start:] = torch.rand(m, sudoku.COMPLETION_CHARS, generator=gen) < t
    logits = model(input_ids=torch.where(masked, MASK_ID, ids)).logits
    ce = torch.nn.functional.cross_entropy(logits.transpose(1, 2), ids, reduction="none")
    return ((ce * masked / t).sum(1) / sudoku.COMPLETION_CHARS).mean()


def train(model: Any, tokenizer: Any) -> dict[str, Any]:
    cfg, gen = TRAIN, torch.Generator().manual_seed(TRAIN["seed"])
    opt = torch.optim.AdamW(model.parameters(), lr=cfg["lr"], weight_decay=cfg["weight_decay"])

    def lr_factor(step: int) -> float:
        warm, progress = cfg["warmup_steps"], max(0, step - cfg["warmup_steps"])
        cosine = 0.1 + 0.45 * (1 + math.cos(math.pi * (progress / max(1, cfg["steps"] - warm))))
        return min(1.0, (step + 1) / warm) * cosine

    scheduler = torch.optim.lr_scheduler.LambdaLR(opt, lr_factor)  # (a new model is in train mode)
    losses: list[float] = []
    for step in range(cfg["steps"]):
        grids, blank = sample_puzzles(cfg["batch_size"], gen)
        noisy = blank & (torch.rand(grids.shape, generator=gen) < cfg["label_noise"])
        grids = torch.where(noisy, torch.randint(1, 5, grids.shape, generator=gen), grids)
        loss = diffusion_loss(model, encode_batch(tokenizer, grids, blank), gen)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        scheduler.step()
        losses.append(loss.item())
        if (step + 1) % 100 == 0:
            print(f"  step {step + 1:5d}  loss {sum(losses[-100:]) / 100:.4f}", flush=True)
    model.eval()
    return {"final_train_loss": round(sum(losses[-100:]) / 100, 6)}


@torch.no_grad()
def sample(
    model: Any, prompt_ids: torch.Tensor, steps: int, temperature: float, gen: Any = None
) -> torch.Tensor:
    """Reference sampler: 16 masked tokens, unmask the 16/steps most confident per step.

    x0 is the argmax (temperature 0) or a Gumbel-max sample of logits/temperature; confidence is
    the softmax probability of x0 (LLaDA's low-confidence remasking). Returns (m, 16) token ids.
    """
    m, n, per_step = prompt_ids.shape[0], sudoku.COMPLETION_CHARS, sudoku.COMPLETION_CHARS // steps
    x = torch.cat([prompt_ids, torch.full((m, n), MASK_ID)], dim=1)
    for _ in range(steps):
        logits = model(input_ids=x).logits[:, -n:].double()
        x0 = logits.argmax(-1)
        if temperature > 0:  # Gumbel-max: an exact sample of softmax(logits / temperature)
            u = torch.rand(logits.shape, generator=gen, dtype=torch.float64).clamp_min(1e-20)
            x0 = (logits / temperature - torch.log(-torch.log(u))).argmax(-1)
        confidence = torch.softmax(logits, -1).gather(-1, x0[..., None])[..., 0]
        confidence = torch.where(x[:, -n:] == MASK_ID, confidence, -math.inf)
        chosen = confidence.topk(per_step, dim=-1).indices
        x[:, -n:] = x[:, -n:].scatter(1, chosen, x0.gather(1, chosen))
    return x[:, -n:]


def evaluate(model: Any, tokenizer: Any, split: str, counts: tuple[int, ...]) -> dict[str, Any]:
    """Greedy solved rate and mean reward, sampled pass@1 / pass@k, for each sampler step count."""
    cfg, k = EVAL, EVAL["samples"]
    prompts = [p.prompt for p in sudoku.make_problems(cfg["problems"], cfg["problem_seed"], split)]
    prompt_ids = torch.tensor(tokenizer(prompts)["input_ids"])
    results: dict[str, Any] = {}
    for steps in counts:
        greedy = tokenizer.batch_decode(sample(model, prompt_ids, steps, 0.0))
        greedy_rewards = torch.tensor(sudoku.sudoku_reward(prompts, greedy))
        gen = torch.Generator().manual_seed(cfg["sample_seed"])
        ids = sample(model, prompt_ids.repeat_interleave(k, 0), steps, cfg["temperature"], gen)
        repeated = [p for p in prompts for _ in range(k)]
        rewards = torch.tensor(sudoku.sudoku_reward(repeated, tokenizer.batch_decode(ids)))
        solved = (rewards == 1.0).view(-1, k)
        metrics = {
            "greedy_solved": (greedy_rewards == 1.0).float().mean(),
            "greedy_mean_reward": greedy_rewards.mean(),
            "pass1": solved.float().mean(),
            f"pass{k}": solved.any(1).float().mean(),
            "sampled_mean_reward": rewards.mean(),
        }
        results[f"steps{steps}"] = {name: round(v.item(), 6) for name, v in metrics.items()}
    return results


def build(out: Path) -> dict[str, Any]:
    start = time.perf_counter()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    tokenizer = build_tokenizer()
    model = build_model(len(tokenizer))
    params = sum(p.numel() for p in model.parameters())
    print(f"model: {params} parameters; training {TRAIN['steps']} steps ...", flush=True)
    train_metrics = train(model, tokenizer)
    train_metrics["train_seconds"] = round(time.perf_counter() - start, 1)
    heldout = evaluate(model, tokenizer, "heldout", EVAL_STEPS)
    train_eval = evaluate(model, tokenizer, "train", EVAL_STEPS[:1])  # overfitting check
    print(f"held-out: {heldout}\ntrain:    {train_eval}")
    k, (low, high) = EVAL["samples"], ACCEPT["heldout_greedy_solved"]
    for metrics in heldout.values():  # 16 and 8 sampler steps alike
        gap = metrics[f"pass{k}"] - metrics["pass1"]
        if not low <= metrics["greedy_solved"] <= high or gap < ACCEPT["min_pass8_minus_pass1"]:
            raise RuntimeError(f"held-out metrics {heldout} miss {ACCEPT}: adjust TRAIN or MODEL")
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    files = sorted(asset_tools.file_entries(out))
    manifest = {
        "description": "Tiny ModernBERT masked-diffusion LM (LLaDA loss) for tasks.sudoku",
        "command": COMMAND,
        "format": "27 prompt + 16 completion tokens: 'Sudoku 12.4 .4.2 2.43 4.2.:1234341221434321'",
        "special_tokens": {t: i for i, t in enumerate(SPECIAL_TOKENS)},
        "task": {"blanks": sudoku.BLANKS, "heldout_modulus": sudoku.HELDOUT_MODULUS},
        "model": {**MODEL, "vocab_size": len(tokenizer), "parameters": params},
        "training": TRAIN,
        "eval": {**EVAL, "sampler_steps": EVAL_STEPS, "remasking": "low-confidence"},
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
