"""Train the compositional task's discrete generator; write it to ``genrl/assets/compositional_discrete``.

    python scripts/build_discrete_assets.py              # train, write the pipeline + manifest
    python scripts/build_discrete_assets.py --check      # verify shipped files vs manifest
    python scripts/build_discrete_assets.py --reproduce  # rebuild in a temp dir, compare

An ``AmusedPipeline`` (Patil et al. 2024, "aMUSEd: An Open MUSE Reproduction") at the
compositional task's 32x32 canvases, saved with ``save_pretrained`` so that the ``amused``
adapter loads it as it loads amused/amused-256. Everything is rendered
(``tasks/compositional_render.py``); nothing is downloaded. One CPU thread, deterministic
kernels, explicit generators: the same machine and torch build give the same bytes.

1. Tokenizer: CLIP's byte-level BPE (lowercase, ``</w>`` ends a word) with merges learned on
   the task grammar's words, so every word of every prompt is one token; 16 positions (the
   longest prompt is 10 words plus the start and end tokens).
2. ``VQModel``: 3 blocks (4x downsampling: an 8x8 grid of tokens, each a 4x4-pixel patch), a
   codebook of ``VQ["num_vq_embeddings"]`` entries, ``lookup_from_codebook`` (decode takes ids,
   as aMUSEd's VQ-GAN). Trained on random layouts (0 to 4 objects of uniform shapes, colours
   and cells) with VQ-VAE's loss (van den Oord et al. 2017, eq. 3: reconstruction plus
   codebook and commitment terms, straight-through gradients), the codebook initialised from
   encoder outputs and every entry unused for ``VQ_TRAIN["restart_every"]`` steps re-drawn
   from the current batch's encoder outputs (dead-code restart), so that all codes stay in
   use. The build fails unless the compositional scorer reads decoded scenes of held-out
   prompts as correct at least ``VQ_TRAIN["min_decoded_accuracy"]`` of the time.
3. ``CLIPTextModelWithProjection`` and ``UVit2DModel`` trained together with MaskGIT's loss
   (Chang et al. 2022, sec. 3.2: a fraction ``cos(pi u / 2)``, ``u ~ U(0, 1)``, of the tokens
   masked, cross-entropy on the masked ones) on token grids of rendered scenes of TRAINING
   prompts only (a uniform category, a uniform training spec of it, a uniform template), with
   10% empty prompts for classifier-free guidance and the adapter's micro-conditioning
   (32, 32, 0, 0, 6). Stopped early (``UVIT_TRAIN["steps"]``) so RL has headroom; the build
   fails unless the held-out score lands in ``UVIT_TRAIN["accept_score"]``.

Held-out protocol (``EVAL``): ``heldout_prompts()`` (25) x 8 samples, sample ``i`` gets prompt
``i % 25``, one batch drawn from ``manual_seed(EVAL["seed"])``, MaskGRPO's emerge sampler at
temperature 1, guidance ``EVAL["guidance_scale"]`` (aMUSEd's rule), scored by the
``compositional`` reward.
"""

from __future__ import annotations

import math
import random
import re
import sys
import time
from collections import Counter
from itertools import pairwise
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

import asset_tools

from reward_models.compositional import CompositionalReward
from tasks.compositional import (
    CANVAS,
    CATEGORIES,
    COLOUR_NAMES,
    SHAPES,
    TEMPLATES,
    all_specs,
    heldout_prompts,
    specs_of,
)
from tasks.compositional_render import CELLS, render, sample_scene

OUT_DIR = REPO_ROOT / "genrl" / "assets" / "compositional_discrete"
COMMAND = "python scripts/build_discrete_assets.py"
MAX_PROMPT_TOKENS = 16

VQ: dict[str, Any] = {"block_out_channels": [16, 32, 32], "layers_per_block": 1}
VQ |= {"latent_channels": 8, "vq_embed_dim": 8, "num_vq_embeddings": 64, "norm_num_groups": 8}
VQ_TRAIN: dict[str, Any] = {"seed": 0, "steps": 600, "batch_size": 64, "lr": 2e-3}
VQ_TRAIN |= {"optimizer": "Adam", "beta": 0.25, "restart_every": 100}
VQ_TRAIN |= {"min_decoded_accuracy": 0.9, "eval_scenes_per_category": 100, "eval_seed": 7}
TEXT: dict[str, Any] = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2}
UVIT: dict[str, Any] = {"hidden_size": 64, "block_out_channels": 32, "in_channels": 32}
UVIT |= {"num_res_blocks": 3, "block_num_heads": 2, "num_hidden_layers": 2}
UVIT |= {"num_attention_heads": 4, "intermediate_size": 128}
UVIT_TRAIN: dict[str, Any] = {"seed": 0, "steps": 500, "batch_size": 64, "lr": 3e-3}
UVIT_TRAIN |= {"optimizer": "AdamW", "weight_decay": 0.01, "label_dropout": 0.1}
UVIT_TRAIN |= {"mask_ratio": "cos(pi u / 2), u ~ U(0, 1), at least one token"}
UVIT_TRAIN |= {"eval_every": 250, "accept_score": [0.05, 0.4]}
EVAL: dict[str, Any] = {"prompts": "heldout_prompts() (25)", "samples_per_prompt": 8}
EVAL |= {"sampler": "emerge", "steps": 8, "temperature": 1.0, "guidance_scale": 2.0}
EVAL |= {"seed": 1234, "reward": "compositional (all requirements met)"}


# -- the tokenizer ------------------------------------------------------------------------------
def _byte_characters() -> list[str]:
    """GPT-2 / CLIP's byte -> printable character table, in CLIP's vocabulary order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    printable += list(range(ord("®"), ord("ÿ") + 1))
    table, extra = {b: chr(b) for b in printable}, 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return list(table.values())


def grammar_words() -> list[str]:
    """Every word of every prompt the task's grammar writes, sorted."""
    words = {w for spec in all_specs() for t in range(len(TEMPLATES)) for w in spec.text(t).split()}
    return sorted(words)


def learn_merges(words: list[str]) -> list[tuple[str, str]]:
    """BPE (Sennrich et al. 2016) run until every word is one symbol: repeatedly merge the most
    frequent adjacent pair (ties: the smallest pair), each word counted once."""
    pieces = [(*w[:-1], w[-1] + "</w>") for w in words]
    merges: list[tuple[str, str]] = []
    while True:
        pairs: Counter[tuple[str, str]] = Counter(p for word in pieces for p in pairwise(word))
        if not pairs:
            return merges
        best = min(pairs, key=lambda p: (-pairs[p], p))
        merges.append(best)
        merged = []
        for word in pieces:
            out: list[str] = []
            for symbol in word:
                if out and (out[-1], symbol) == best:
                    out[-1] += symbol
                else:
                    out.append(symbol)
            merged.append(tuple(out))
        pieces = merged


def build_tokenizer() -> Any:
    """A CLIP tokenizer whose merges spell each grammar word as one token; any other text
    still tokenizes (byte symbols)."""
    from transformers import CLIPTokenizer

    words = grammar_words()
    if any(not re.fullmatch(r"[a-z]+", w) for w in words):
        raise ValueError(f"the grammar has words CLIP's pre-tokenizer would split: {words}")
    merges = learn_merges(words)
    symbols = _byte_characters()
    tokens = symbols + [s + "</w>" for s in symbols] + ["".join(m) for m in merges]
    tokens += ["<|startoftext|>", "<|endoftext|>"]
    vocab = {token: i for i, token in enumerate(dict.fromkeys(tokens))}
    return CLIPTokenizer(vocab=vocab, merges=merges, model_max_length=MAX_PROMPT_TOKENS)


# -- the models ---------------------------------------------------------------------------------
def build_models(seed: int, tokenizer: Any) -> dict[str, Any]:
    """The pipeline's components with fresh weights drawn from ``seed``."""
    from diffusers import AmusedScheduler, UVit2DModel, VQModel
    from transformers import CLIPTextConfig, CLIPTextModelWithProjection

    torch.manual_seed(seed)
    codes = VQ["num_vq_embeddings"]
    vqvae = VQModel(
        in_channels=3,
        out_channels=3,
        down_block_types=("DownEncoderBlock2D",) * len(VQ["block_out_channels"]),
        up_block_types=("UpDecoderBlock2D",) * len(VQ["block_out_channels"]),
        block_out_channels=tuple(VQ["block_out_channels"]),
        layers_per_block=VQ["layers_per_block"],
        latent_channels=VQ["latent_channels"],
        norm_num_groups=VQ["norm_num_groups"],
        num_vq_embeddings=codes,
        vq_embed_dim=VQ["vq_embed_dim"],
        sample_size=CANVAS,
        lookup_from_codebook=True,
        force_upcast=False,
        mid_block_add_attention=False,
    )
    hidden = TEXT["hidden_size"]
    text_config = CLIPTextConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        projection_dim=hidden,
        num_hidden_layers=TEXT["num_hidden_layers"],
        num_attention_heads=TEXT["num_attention_heads"],
        max_position_embeddings=MAX_PROMPT_TOKENS,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    text_encoder = CLIPTextModelWithProjection(text_config)
    factor = 2 ** (len(VQ["block_out_channels"]) - 1)
    transformer = UVit2DModel(
        **UVIT,
        cond_embed_dim=hidden,  # CLIP's projection (the pooled text embedding)
        micro_cond_encode_dim=2,
        micro_cond_embed_dim=10,  # 5 micro-conditions x micro_cond_encode_dim
        encoder_hidden_size=hidden,  # CLIP's hidden states
        vocab_size=codes + 1,  # the codebook and aMUSEd's mask token, the last id
        codebook_size=codes,
        sample_size=CANVAS // factor,
    )
    scheduler = AmusedScheduler(mask_token_id=codes, masking_schedule="cosine")
    return {
        "vqvae": vqvae,
        "tokenizer": tokenizer,
        "text_encoder": text_encoder,
        "transformer": transformer,
        "scheduler": scheduler,
    }


# -- data ---------------------------------------------------------------------------------------
def random_layouts(rng: random.Random, n: int) -> list[list[Any]]:
    """``n`` scenes of 0 to 4 objects of uniform shapes and colours in distinct uniform cells."""
    scenes = []
    for _ in range(n):
        cells = rng.sample(CELLS, rng.randint(0, len(CELLS)))
        scenes.append([(rng.choice(SHAPES), rng.choice(COLOUR_NAMES), c, r) for c, r in cells])
    return scenes


def training_batch(
    rng: random.Random, gen: torch.Generator, batch: int
) -> tuple[list[str], torch.Tensor]:
    """Captions and canvases ``[batch, 3, 32, 32]`` of training specs (uniform category)."""
    by_category = {c: [s for s in specs_of("train") if s.category == c] for c in CATEGORIES}
    captions, scenes = [], []
    for _ in range(batch):
        spec = rng.choice(by_category[rng.choice(CATEGORIES)])
        captions.append(spec.text(rng.randrange(len(TEMPLATES))))
        scenes.append(sample_scene(spec, rng))
    return captions, render(scenes, gen)


# -- the VQ model -------------------------------------------------------------------------------
def train_vq(vqvae: Any, steps: int) -> dict[str, Any]:
    """VQ-VAE training with dead-code restarts (module docstring, 2)."""
    cfg = VQ_TRAIN
    rng, gen = random.Random(cfg["seed"]), torch.Generator().manual_seed(cfg["seed"])
    quantize, codes = vqvae.quantize, VQ["num_vq_embeddings"]
    quantize.beta = cfg["beta"]
    with torch.no_grad():  # codebook from encoder outputs: every entry starts near the data
        z = vqvae.encode(render(random_layouts(rng, 64), gen)).latents
        z = z.permute(0, 2, 3, 1).reshape(-1, z.shape[1])
        quantize.embedding.weight.copy_(z[torch.randperm(len(z), generator=gen)[:codes]])
    optimizer = torch.optim.Adam(vqvae.parameters(), lr=cfg["lr"])
    used = torch.zeros(codes, dtype=torch.bool)
    vqvae.train()
    loss = recon = torch.zeros(())
    for step in range(1, steps + 1):
        x = render(random_layouts(rng, cfg["batch_size"]), gen)
        z = vqvae.encode(x).latents
        z_q, vq_loss, (_, _, indices) = quantize(z)
        decoded = vqvae.decoder(vqvae.post_quant_conv(z_q))
        recon = F.mse_loss(decoded, x)
        loss = recon + vq_loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        used[indices.flatten()] = True
        if step % cfg["restart_every"] == 0 and step < steps:
            dead = (~used).nonzero().flatten()
            if len(dead):
                with torch.no_grad():
                    flat = z.detach().permute(0, 2, 3, 1).reshape(-1, z.shape[1])
                    pick = torch.randint(len(flat), (len(dead),), generator=gen)
                    quantize.embedding.weight[dead] = flat[pick]
            used.zero_()
        if step % 500 == 0:
            print(f"vq step {step}: recon {recon.item():.5f}, loss {loss.item():.5f}", flush=True)
    vqvae.eval()
    return {"final_recon_mse": round(recon.item(), 6), "final_loss": round(loss.item(), 6)}


@torch.no_grad()
def encode_tokens(vqvae: Any, images: torch.Tensor) -> torch.Tensor:
    """``[B, h, w]`` nearest-codebook ids of ``images`` (as the adapter's ``encode_images``)."""
    latents = vqvae.encode(images).latents
    indices = vqvae.quantize(latents)[2][2]
    return indices.reshape(images.shape[0], *latents.shape[2:])


@torch.no_grad()
def decode_tokens(vqvae: Any, tokens: torch.Tensor) -> torch.Tensor:
    """Token grids ``[B, h, w]`` -> images in ``[0, 1]`` (as the adapter's ``decode_images``)."""
    shape = (*tokens.shape, vqvae.config.vq_embed_dim)
    out = vqvae.decode(tokens.flatten(), force_not_quantize=True, shape=shape).sample
    return out.clip(0, 1)


@torch.no_grad()
def decoded_accuracy(vqvae: Any, reward: CompositionalReward) -> dict[str, Any]:
    """The ``compositional`` reward of rendered scenes of held-out specs, as rendered and after
    ``decode(encode(x))``, per category and overall; the codebook's usage."""
    cfg = VQ_TRAIN
    rng, gen = random.Random(cfg["eval_seed"]), torch.Generator().manual_seed(cfg["eval_seed"])
    prompts, scenes = [], []
    for category in CATEGORIES:
        specs = [s for s in specs_of("heldout") if s.category == category]
        for _ in range(cfg["eval_scenes_per_category"]):
            spec = rng.choice(specs)
            prompts.append(spec.text())
            scenes.append(sample_scene(spec, rng))
    images = render(scenes, gen)
    tokens = encode_tokens(vqvae, images)
    decoded = decode_tokens(vqvae, tokens)
    clean = reward(images, prompts).scores
    after = reward(decoded, prompts).scores
    result: dict[str, Any] = {
        "rendered": round(float(clean["compositional"].mean()), 6),
        "decoded": round(float(after["compositional"].mean()), 6),
        "decoded_by_category": {c: round(float(after[c].nanmean()), 6) for c in CATEGORIES},
        "recon_mse": round(float(F.mse_loss(decoded, images)), 6),
        "codes_used": int(tokens.unique().numel()),
    }
    return result


# -- the masked transformer ---------------------------------------------------------------------
def micro_conditions(n: int) -> torch.Tensor:
    """The adapter's micro-conditioning: width, height, crop top, crop left, aesthetic 6."""
    return torch.tensor([CANVAS, CANVAS, 0, 0, 6.0]).expand(n, -1)


def text_inputs(components: dict[str, Any], captions: list[str]) -> tuple[torch.Tensor, ...]:
    """(pooled, penultimate hidden states) of ``captions`` as ``AmusedPipeline`` encodes them."""
    ids = components["tokenizer"](
        captions,
        return_tensors="pt",
        padding="max_length",
        truncation=True,
        max_length=MAX_PROMPT_TOKENS,
    ).input_ids
    out = components["text_encoder"](ids, return_dict=True, output_hidden_states=True)
    return out.text_embeds, out.hidden_states[-2]


def train_uvit(components: dict[str, Any], steps: int, evaluate: Any = None) -> dict[str, Any]:
    """MaskGIT training of the text encoder and the U-ViT (module docstring, 3); ``evaluate``
    (a function of the components returning the held-out score) every ``eval_every`` steps."""
    cfg = UVIT_TRAIN
    rng, gen = random.Random(cfg["seed"]), torch.Generator().manual_seed(cfg["seed"])
    vqvae, text_encoder, transformer = (
        components[k] for k in ("vqvae", "text_encoder", "transformer")
    )
    mask_id = VQ["num_vq_embeddings"]
    params = [*text_encoder.parameters(), *transformer.parameters()]
    optimizer = torch.optim.AdamW(params, lr=cfg["lr"], weight_decay=cfg["weight_decay"])
    history: list[list[float]] = []
    loss = torch.zeros(())
    for step in range(1, steps + 1):
        # (the adapter that evaluates freezes the pipeline's modules)
        text_encoder.requires_grad_(True).train(), transformer.requires_grad_(True).train()
        captions, images = training_batch(rng, gen, cfg["batch_size"])
        captions = ["" if rng.random() < cfg["label_dropout"] else c for c in captions]
        tokens = encode_tokens(vqvae, images)
        n, length = tokens.shape[0], tokens[0].numel()
        u = torch.rand(n, generator=gen)
        masked_count = (torch.cos(math.pi * u / 2) * length).ceil().clamp(min=1)
        ranks = torch.rand(n, length, generator=gen).argsort(-1).argsort(-1)
        masked = (ranks < masked_count[:, None]).reshape(tokens.shape)
        pooled, hidden = text_inputs(components, captions)
        logits = transformer(
            torch.where(masked, mask_id, tokens),
            micro_conds=micro_conditions(n),
            pooled_text_emb=pooled,
            encoder_hidden_states=hidden,
        )  # [B, K, h, w]
        loss = F.cross_entropy(logits.permute(0, 2, 3, 1)[masked], tokens[masked])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if evaluate is not None and step % cfg["eval_every"] == 0:
            score = evaluate(components)
            history.append([step, round(score, 6)])
            print(f"uvit step {step}: loss {loss.item():.4f}, held-out {score:.3f}", flush=True)
    text_encoder.eval(), transformer.eval()
    return {"final_train_loss": round(loss.item(), 6), "score_history": history}


def pipeline_of(components: dict[str, Any]) -> Any:
    from diffusers import AmusedPipeline

    return AmusedPipeline(**components)


@torch.no_grad()
def heldout_scores(components: dict[str, Any], reward: CompositionalReward) -> dict[str, float]:
    """Every score of the ``compositional`` reward over the held-out protocol (``EVAL``),
    sampled through the ``amused`` adapter."""
    from pipelines.diffusers.amused import AmusedPolicy
    from samplers.masked_image import EmergeSampler

    policy = AmusedPolicy(pipeline=pipeline_of(components), guidance_scale=EVAL["guidance_scale"])
    sampler = EmergeSampler(EVAL["steps"], EVAL["temperature"], policy.masking_schedule)
    prompts = heldout_prompts()
    order = [prompts[i % len(prompts)] for i in range(len(prompts) * EVAL["samples_per_prompt"])]
    ids, mask = policy.encode_prompts(order)
    gen = torch.Generator().manual_seed(EVAL["seed"])
    out = policy.generate(ids, mask, sampler, policy.num_image_tokens, gen)
    images = policy.decode_images(out.tokens)
    scores = reward(images, order).scores
    return {k: round(float(v.nanmean()), 6) for k, v in scores.items()}


# -- the build ----------------------------------------------------------------------------------
def file_entries(out: Path) -> dict[str, dict[str, Any]]:
    """``{relative path: {sha256, size_bytes}}`` of every file under ``out`` but the manifest
    (a pipeline folder has one subfolder per component)."""
    paths = sorted(p for p in out.rglob("*") if p.is_file() and p.name != asset_tools.MANIFEST)
    return {
        p.relative_to(out).as_posix(): {
            "sha256": asset_tools.sha256(p),
            "size_bytes": p.stat().st_size,
        }
        for p in paths
    }


def build(out: Path) -> dict[str, Any]:
    start = time.perf_counter()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    reward = CompositionalReward()
    components = build_models(0, build_tokenizer())
    print(f"training the VQ model, {VQ_TRAIN['steps']} steps ...", flush=True)
    vq_metrics = train_vq(components["vqvae"], VQ_TRAIN["steps"])
    vq_metrics["heldout"] = decoded_accuracy(components["vqvae"], reward)
    vq_metrics["train_seconds"] = round(time.perf_counter() - start, 1)
    print(f"VQ: {vq_metrics}", flush=True)
    if vq_metrics["heldout"]["decoded"] < VQ_TRAIN["min_decoded_accuracy"]:
        raise RuntimeError(f"decoded scenes score {vq_metrics['heldout']}: adjust VQ or VQ_TRAIN")
    components["vqvae"].requires_grad_(False)
    uvit_start = time.perf_counter()
    uvit_metrics = train_uvit(
        components,
        UVIT_TRAIN["steps"],
        lambda c: heldout_scores(c, reward)["compositional"],
    )
    uvit_metrics["train_seconds"] = round(time.perf_counter() - uvit_start, 1)
    uvit_metrics["heldout"] = heldout_scores(components, reward)
    print(f"U-ViT: {uvit_metrics}", flush=True)
    low, high = UVIT_TRAIN["accept_score"]
    if not low <= uvit_metrics["heldout"]["compositional"] <= high:
        raise RuntimeError(
            f"held-out score {uvit_metrics['heldout']} outside {UVIT_TRAIN['accept_score']}"
        )
    out.mkdir(parents=True, exist_ok=True)
    pipeline_of(components).save_pretrained(out)
    counts = {
        k: sum(p.numel() for p in components[k].parameters())
        for k in ("vqvae", "text_encoder", "transformer")
    }
    manifest = {
        "description": "Compositional task, discrete track: an AmusedPipeline (VQ tokenizer, "
        "CLIP text encoder, U-ViT masked-token transformer) at 32x32, 8x8 tokens",
        "command": COMMAND,
        "parameters": counts,
        "vq": {"config": VQ, "training": VQ_TRAIN, "metrics": vq_metrics},
        "text_encoder": {"config": TEXT, "max_prompt_tokens": MAX_PROMPT_TOKENS},
        "transformer": {"config": UVIT, "training": UVIT_TRAIN, "metrics": uvit_metrics},
        "heldout_protocol": EVAL,
        "reproducibility": "bit-identical across runs with the same torch build and CPU type",
        "torch_version": torch.__version__,
        "files": file_entries(out),
    }
    asset_tools.write_manifest(out, manifest)
    print(f"wrote {out}; total {time.perf_counter() - start:.1f} s")
    return manifest


if __name__ == "__main__":
    sys.exit(asset_tools.main(None, __doc__.splitlines()[0], OUT_DIR, COMMAND, build))
