"""Train the compositional task's scorer and flow model; write them to ``genrl/assets/compositional``.

    python scripts/build_compositional_assets.py              # train, write weights + manifest
    python scripts/build_compositional_assets.py --check      # verify shipped files vs manifest
    python scripts/build_compositional_assets.py --reproduce  # rebuild in a temp dir, compare

Everything is rendered (``tasks/compositional_render.py``); nothing is downloaded.
One CPU thread, deterministic kernels, explicit generators: the same machine and torch build
give the same bytes.

1. ``CellScorer`` (``reward_models/compositional.py``): a per-cell detector trained on random
   layouts (0 to 4 objects, uniform shapes, colours and cells), augmented so that it reads
   generated canvases too: gaussian noise, blur, overall brightness, and faint "ghost" objects
   (at most ``GHOST_ALPHA`` of full intensity) in empty cells that must read as empty. The build
   fails unless its accuracy on held-out scenes (``scorer_accuracy``) reaches
   ``SCORER["min_accuracy"]`` in every category.
2. ``CompositionalFlowModel`` (``pipelines/toy/compositional.py``): flow matching on rendered
   scenes of TRAINING prompts only (a uniform category, then a uniform training spec of it and a
   uniform template), x0-prediction loss as the video model, 10% null prompts for CFG. It needs
   no handicap to leave RL headroom: on held-out combinations it draws single objects and
   colours well but relations and colour bindings poorly (0.17 and 0.22 after 4,000 steps, the
   whole held-out score 0.365; it stayed within 0.29-0.39 from step 1,000 on, and a trial at lr
   2e-3 ended at 0.37). ``caption_noise`` (the digit models' label noise: a fraction of scenes
   drawn from another training spec of the same category than the caption says) is 0; 0.3 gave
   0.1-0.19 after 3,000 steps. The build fails unless the held-out score lands in
   ``FLOW["accept_score"]``.

3. The artifact probe of ``compositional_artifact_probe`` (``reward_models/artifact.py``): a
   head with 32 hidden units on the scorer's cell features and the 8x8-pooled pixels, trained
   on renders of training specs (clean) and the same renders with noise, blur, duplicated
   objects or grid lines (artifacts). A metric that no recipe trains on; the build fails
   unless its held-out accuracy reaches ``PROBE["min_accuracy"]``.

Held-out protocol (the trainer's evaluation of ``compositional_flow_grpo``): the prompts
``heldout_prompts()`` (25: up to 8 held-out combinations per category, first template) x 8
samples (sample ``i`` gets prompt ``i % 25``), initial noise ``randn(200, 3, 32, 32,
generator=manual_seed(1234))``, a 10-step Euler ODE on ``flow_sigmas(10)`` without CFG, scored
by the ``compositional`` reward with the freshly built scorer. The flow model's metrics are
measured on the float16-rounded weights that ship.
"""

from __future__ import annotations

import random
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

import asset_tools

from genrl.cli.train_reward import CORRUPTIONS, corrupt, train_probe
from pipelines.toy.compositional import (
    EMBEDDED_COMPOSITIONAL_FLOW,
    CompositionalFlowModel,
    load_compositional_model,
    null_tokens,
    save_compositional_model,
    tokenize,
)
from pipelines.toy.models import to_pixels
from reward_models.artifact import feature_extractor, load_probe, save_probe
from reward_models.compositional import EMBEDDED_ARTIFACT_PROBE, CompositionalReward
from samplers import FlowODESampler, flow_sigmas
from tasks.compositional import (
    CATEGORIES,
    COLOUR_NAMES,
    SHAPES,
    TEMPLATES,
    Spec,
    all_specs,
    heldout_prompts,
    requirements_met,
    specs_of,
)
from tasks.compositional_render import (
    CELLS,
    cell_labels,
    render,
    sample_scene,
)
from tasks.compositional_scorer import (
    EMBEDDED_SCORER,
    CellScorer,
    load_scorer,
    read_scenes,
    save_scorer,
)

OUT_DIR = REPO_ROOT / "genrl" / "assets" / "compositional"
COMMAND = "python scripts/build_compositional_assets.py"
GHOST_ALPHA = 0.3

SCORER: dict[str, Any] = {"config": {"channels": 16, "hidden_dim": 64}, "seed": 0}
SCORER |= {"steps": 1000, "batch_size": 128, "lr": 2e-3, "optimizer": "Adam"}
SCORER |= {"min_accuracy": 0.97, "eval_scenes_per_category": 400, "eval_seed": 7}
SCORER |= {
    "augmentation": "ghost objects (alpha ~ U(0, 0.3)) in half the empty cells of half the "
    "canvases; brightness x U(0.7, 1.1); box blur on a quarter; noise std ~ U(0, 0.1); clamp"
}
FLOW: dict[str, Any] = {
    "config": {"hidden_dim": 128, "num_layers": 3, "text_dim": 64, "text_layers": 2},
    "seed": 0,
}
FLOW |= {"steps": 4000, "batch_size": 128, "lr": 1e-3, "optimizer": "Adam"}
FLOW |= {"time_sampling": "s ~ U(0, 1)", "label_dropout": 0.1, "caption_noise": 0.0}
FLOW |= {"eval_every": 500, "accept_score": [0.2, 0.5]}
PROBE: dict[str, Any] = {"backbone": "compositional", "hidden": 32, "epochs": 300, "seed": 0}
PROBE |= {"clean_scenes": 1200, "min_accuracy": 0.9}
EVAL: dict[str, Any] = {"prompts": "heldout_prompts() (25)", "samples_per_prompt": 8}
EVAL |= {"noise_seed": 1234, "num_steps": 10, "sigmas": "flow_sigmas(10), no shift"}
EVAL |= {"guidance": 1.0, "reward": "compositional (all requirements met)"}


# -- the scorer ---------------------------------------------------------------------------------
def random_layout(rng: random.Random) -> list[tuple[str, str, int, int]]:
    """0 to 4 objects of uniform shapes and colours in distinct uniform cells."""
    cells = rng.sample(CELLS, rng.randint(0, len(CELLS)))
    return [(rng.choice(SHAPES), rng.choice(COLOUR_NAMES), c, r) for c, r in cells]


def augment(
    canvases: torch.Tensor, scenes: list[list[Any]], rng: random.Random, gen: torch.Generator
) -> torch.Tensor:
    """The scorer's training augmentation (``SCORER["augmentation"]``)."""
    batch = len(scenes)
    ghosts = []
    for scene in scenes:
        used = {(o[2], o[3]) for o in scene}
        free = [c for c in CELLS if c not in used and rng.random() < 0.5]
        ghosts.append(
            [(rng.choice(SHAPES), rng.choice(COLOUR_NAMES), c, r) for c, r in free]
            if rng.random() < 0.5
            else []
        )
    alpha = GHOST_ALPHA * torch.rand(batch, 1, 1, 1, generator=gen)
    x = canvases + alpha * render(ghosts, gen)
    x = x * (0.7 + 0.4 * torch.rand(batch, 1, 1, 1, generator=gen))
    blur = torch.rand(batch, generator=gen) < 0.25
    blurred = F.avg_pool2d(F.pad(x, (1, 1, 1, 1), mode="replicate"), 3, stride=1)
    x = torch.where(blur[:, None, None, None], blurred, x)
    x = x + 0.1 * torch.rand(batch, 1, 1, 1, generator=gen) * torch.randn(x.shape, generator=gen)
    return x.clamp(0.0, 1.0)


def train_scorer() -> tuple[CellScorer, dict[str, Any]]:
    torch.manual_seed(SCORER["seed"])
    gen = torch.Generator().manual_seed(SCORER["seed"])
    rng = random.Random(f"scorer-{SCORER['seed']}")
    model = CellScorer(**SCORER["config"])
    optimizer = torch.optim.Adam(model.parameters(), lr=SCORER["lr"])
    for step in range(1, SCORER["steps"] + 1):
        scenes = [random_layout(rng) for _ in range(SCORER["batch_size"])]
        images = augment(render(scenes, gen), scenes, rng, gen)
        shapes, colours = cell_labels(scenes)
        shape_logits, colour_logits = model(images)
        loss = F.cross_entropy(shape_logits.flatten(0, 1), shapes.flatten())
        loss = loss + F.cross_entropy(
            colour_logits.flatten(0, 1), colours.flatten(), ignore_index=-1
        )
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if step % 500 == 0:
            print(f"  scorer step {step:5d}  loss {loss.item():.4f}", flush=True)
    return model.eval(), {"final_train_loss": round(loss.item(), 6)}


def negative_scene(spec: Spec, rng: random.Random) -> list[Any]:
    """A scene of another spec of the same category that does not meet ``spec``."""
    others = [s for s in all_specs() if s.category == spec.category and s != spec]
    while True:
        scene = sample_scene(rng.choice(others), rng)
        if not requirements_met(spec, scene):
            return scene


@torch.no_grad()
def scorer_accuracy(
    model: CellScorer, per_category: int, seed: int, split: str = "heldout"
) -> dict[str, float]:
    """How often the scorer's verdict (``requirements_met`` on its reading) equals the truth,
    per category, on ``per_category`` scenes of the ``split`` specs: half drawn from the spec
    (correct), half from another spec of the category that fails it; plus ``detection``, the
    fraction of all these scenes read exactly (every cell's shape and colour)."""
    rng = random.Random(f"scorer-eval-{seed}")
    gen = torch.Generator().manual_seed(seed)
    result, exact, total = {}, 0, 0
    for category in CATEGORIES:
        specs = [s for s in specs_of(split) if s.category == category]
        chosen = [specs[i % len(specs)] for i in range(per_category)]
        scenes = [
            sample_scene(s, rng) if i % 2 == 0 else negative_scene(s, rng)
            for i, s in enumerate(chosen)
        ]
        read = read_scenes(model, render(scenes, gen))
        agree = [
            requirements_met(s, r) == requirements_met(s, t)
            for s, r, t in zip(chosen, read, scenes, strict=True)
        ]
        result[category] = round(sum(agree) / len(agree), 6)
        exact += sum(sorted(r) == sorted(t) for r, t in zip(read, scenes, strict=True))
        total += len(scenes)
    result["detection"] = round(exact / total, 6)
    return result


# -- the flow model -----------------------------------------------------------------------------
def training_batch(
    rng: random.Random, gen: torch.Generator, batch: int, caption_noise: float
) -> tuple[list[str], torch.Tensor]:
    """Captions and canvases ``[batch, 3, 32, 32]`` in ``[0, 1]`` of training specs."""
    by_category = {c: [s for s in specs_of("train") if s.category == c] for c in CATEGORIES}
    captions, scenes = [], []
    for _ in range(batch):
        specs = by_category[rng.choice(CATEGORIES)]
        spec = rng.choice(specs)
        captions.append(spec.text(rng.randrange(len(TEMPLATES))))
        drawn = rng.choice(specs) if rng.random() < caption_noise else spec
        scenes.append(sample_scene(drawn, rng))
    return captions, render(scenes, gen)


@torch.no_grad()
def heldout_samples(
    model: CompositionalFlowModel, guidance: float = 1.0
) -> tuple[list[str], torch.Tensor]:
    """The held-out protocol's 200 prompts (sample order) and ODE samples ``[200, 3, 32, 32]``
    in ``[0, 1]``."""
    prompts = heldout_prompts()
    order = [prompts[i % len(prompts)] for i in range(len(prompts) * EVAL["samples_per_prompt"])]
    x = torch.randn(
        len(order), *model.event_shape, generator=torch.Generator().manual_seed(EVAL["noise_seed"])
    )
    tokens, null = tokenize(order), null_tokens(len(order))
    sampler = FlowODESampler(flow_sigmas(EVAL["num_steps"]))
    for i in range(sampler.num_steps):
        sigma = sampler.sigmas[i].expand(len(order))
        v = model(x, sigma, tokens)
        if guidance != 1.0:
            v_null = model(x, sigma, null)
            v = v_null + guidance * (v - v_null)
        x = sampler.step(v, i, x).prev_sample
    return order, to_pixels(x)


def heldout_scores(
    model: CompositionalFlowModel, reward: CompositionalReward, guidance: float = 1.0
) -> dict[str, float]:
    """Mean of every score of the ``compositional`` reward over the held-out protocol's 200
    ODE samples (per-category scores: over their category's samples)."""
    order, images = heldout_samples(model, guidance)
    scores = reward(images, order).scores
    return {k: round(float(v.nanmean()), 6) for k, v in scores.items()}


def train_flow(reward: CompositionalReward) -> tuple[CompositionalFlowModel, dict[str, Any]]:
    torch.manual_seed(FLOW["seed"])
    gen = torch.Generator().manual_seed(FLOW["seed"])
    rng = random.Random(f"flow-{FLOW['seed']}")
    model = CompositionalFlowModel(**FLOW["config"])
    optimizer = torch.optim.Adam(model.parameters(), lr=FLOW["lr"])
    history: list[list[float]] = []
    batch = FLOW["batch_size"]
    for step in range(1, FLOW["steps"] + 1):
        captions, images = training_batch(rng, gen, batch, FLOW["caption_noise"])
        x0 = images * 2 - 1
        tokens = tokenize(captions)
        drop = torch.rand(batch, generator=gen) < FLOW["label_dropout"]
        tokens = torch.where(drop[:, None], null_tokens(batch), tokens)
        s = torch.rand(batch, generator=gen)
        eps = torch.randn(x0.shape, generator=gen)
        s4 = s.view(-1, 1, 1, 1)
        loss = F.mse_loss(model.clean((1 - s4) * x0 + s4 * eps, s, tokens), x0)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if step % FLOW["eval_every"] == 0:
            scores = heldout_scores(model.eval(), reward)
            model.train()
            history.append([step, scores["compositional"]])
            print(f"  flow step {step:5d}  loss {loss.item():.4f}  held-out {scores}", flush=True)
    return model.eval(), {"final_train_loss": round(loss.item(), 6), "score_history": history}


# -- the artifact probe --------------------------------------------------------------------------
def train_artifact_probe(scorer_path: Path, out_path: Path) -> dict[str, Any]:
    """The probe of ``compositional_artifact_probe``: renders of training specs (clean) and
    each once more with one of ``CORRUPTIONS`` in turn (artifact), features from the freshly
    built scorer, ``reward_models.artifact.train_probe`` (25% held out)."""
    rng = random.Random(f"probe-{PROBE['seed']}")
    gen = torch.Generator().manual_seed(PROBE["seed"])
    specs = specs_of("train")
    scenes = [sample_scene(rng.choice(specs), rng) for _ in range(PROBE["clean_scenes"])]
    clean = render(scenes, gen)
    kinds = [CORRUPTIONS[i % len(CORRUPTIONS)] for i in range(len(clean))]
    corrupted = torch.empty_like(clean)
    for kind in CORRUPTIONS:
        rows = [i for i, k in enumerate(kinds) if k == kind]
        corrupted[rows] = corrupt(clean[rows], kind, gen)
    images = torch.cat([clean, corrupted])
    labels = torch.cat([torch.zeros(len(clean)), torch.ones(len(clean))])
    features = feature_extractor(f"compositional:{scorer_path}")(images)
    probe, metrics = train_probe(
        features,
        labels,
        ["clean"] * len(clean) + kinds,
        PROBE["hidden"],
        PROBE["epochs"],
        seed=PROBE["seed"],
    )
    # The shipped probe reads the embedded scorer it was built next to.
    save_probe(probe, PROBE["backbone"], out_path, metrics)
    return metrics


def build(out: Path) -> dict[str, Any]:
    start = time.perf_counter()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    out.mkdir(parents=True, exist_ok=True)
    scorer_path = out / Path(EMBEDDED_SCORER).name
    flow_path = out / Path(EMBEDDED_COMPOSITIONAL_FLOW).name

    print("training scorer ...", flush=True)
    scorer, scorer_metrics = train_scorer()
    save_scorer(scorer, scorer_path)
    scorer = load_scorer(scorer_path)
    accuracy = scorer_accuracy(scorer, SCORER["eval_scenes_per_category"], SCORER["eval_seed"])
    scorer_metrics["heldout_accuracy"] = accuracy
    print(f"scorer held-out accuracy {accuracy}", flush=True)
    if min(accuracy[c] for c in CATEGORIES) < SCORER["min_accuracy"]:
        raise RuntimeError(f"scorer accuracy {accuracy} below {SCORER['min_accuracy']}")

    print("training flow model ...", flush=True)
    reward = CompositionalReward(str(scorer_path))
    flow, flow_metrics = train_flow(reward)
    save_compositional_model(flow, flow_path)
    shipped = load_compositional_model(flow_path)  # float16-rounded: what users get
    flow_metrics["heldout"] = heldout_scores(shipped, reward)
    flow_metrics["heldout_cfg3"] = heldout_scores(shipped, reward, guidance=3.0)
    flow_metrics["train_seconds"] = round(time.perf_counter() - start, 1)
    print(f"held-out: {flow_metrics['heldout']}\nCFG 3: {flow_metrics['heldout_cfg3']}")
    low, high = FLOW["accept_score"]
    if not low <= flow_metrics["heldout"]["compositional"] <= high:
        raise RuntimeError(f"held-out score {flow_metrics['heldout']} outside [{low}, {high}]")
    print("training artifact probe ...", flush=True)
    probe_metrics = train_artifact_probe(scorer_path, out / Path(EMBEDDED_ARTIFACT_PROBE).name)
    print(f"artifact probe: {probe_metrics}", flush=True)
    if probe_metrics["heldout_accuracy"] < PROBE["min_accuracy"]:
        raise RuntimeError(f"artifact probe accuracy {probe_metrics} below {PROBE['min_accuracy']}")
    probe, _, _ = load_probe(out / Path(EMBEDDED_ARTIFACT_PROBE).name)
    extract = feature_extractor(f"compositional:{scorer_path}")
    for guidance, key in ((1.0, "heldout"), (3.0, "heldout_cfg3")):
        _, images = heldout_samples(shipped, guidance)
        with torch.no_grad():
            clean = 1 - torch.sigmoid(probe(extract(images)))
        flow_metrics[key]["artifact_probe"] = round(float(clean.mean()), 6)
    parameters = {
        "scorer": sum(p.numel() for p in scorer.parameters()),
        "flow": sum(p.numel() for p in shipped.parameters()),
    }
    manifest = {
        "description": "Compositional text-to-image task (32x32 RGB, 2x2 grid of cells): a "
        "per-cell scorer (float32) and a text-conditioned flow model (float16 storage)",
        "command": COMMAND,
        "scorer": {**SCORER, "metrics": scorer_metrics, "parameters": parameters["scorer"]},
        "flow": {**FLOW, "metrics": flow_metrics, "parameters": parameters["flow"]},
        "artifact_probe": {**PROBE, "metrics": probe_metrics},
        "heldout_protocol": EVAL,
        "reproducibility": "bit-identical across runs with the same torch build and CPU type",
        "torch_version": torch.__version__,
        "files": asset_tools.file_entries(out),
    }
    asset_tools.write_manifest(out, manifest)
    print(f"wrote {out}; total {time.perf_counter() - start:.1f} s")
    return manifest


def main(argv: list[str] | None = None) -> int:
    return asset_tools.main(argv, __doc__.split("\n", 1)[0], OUT_DIR, COMMAND, build)


if __name__ == "__main__":
    sys.exit(main())
