"""Train the embedded moving-digits video generator and its two digit classifiers and write them
to ``genrl/assets/video_digits``.

    python scripts/build_video_assets.py              # train, write weights + manifest.json
    python scripts/build_video_assets.py --check      # verify shipped files against the manifest
    python scripts/build_video_assets.py --reproduce  # rebuild in a temp dir, compare sha256s

Data: the training split of ``scripts/build_assets.py`` (scikit-learn's ``load_digits``, 80/20,
stratified, seed 0), rendered on the fly into clips by ``pipelines.toy.video.render_clips``:
a uniformly random training digit, direction and start position per clip (fresh every step).

Classifiers (``scripts/video_classifiers.py``, trained first): the reward's 11-class window
classifier (``digit_classifier.safetensors``: digits, and "no single digit" for speckle) and the
held-out judge (``digit_judge.safetensors``: an MLP on whole clean 16x16 frames).

Model: ``MovingDigitFlowModel`` trained by flow matching (``x_s = (1-s) x0 + s eps``, target
``eps - x0``, ``s ~ U(0, 1)``), 10% of the clips with both labels dropped (null labels, for
classifier-free guidance). Like the image model it is left weak on purpose so that RL has
headroom: a fraction ``label_noise`` of the digit labels and, independently, of the direction
labels are replaced by uniformly random ones, so samples are moving digits that are often the
wrong digit or move the wrong way. The build fails unless the held-out reward lands in
``TRAIN["accept_reward"]``.

Held-out reward protocol (the trainer's evaluation of ``video_digits_flow_grpo``): the 40 prompts
``VIDEO_EVAL_PROMPTS`` x 8 samples (sample ``i`` gets prompt ``i % 40``), initial noise
``randn(320, 6, 1, 16, 16, generator=manual_seed(1234))``, a 10-step Euler ODE on
``flow_sigmas(10)`` without CFG, reward ``moving_digit`` and judge ``moving_digit_judge``
(``reward_models/moving_digits.py``) with the classifiers just built. The metrics are measured on
the float16-rounded weights that ship.
"""

from __future__ import annotations

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
from build_assets import SPLIT, load_split
from video_classifiers import JUDGE, REWARD_CLASSIFIER, train_judge, train_reward_classifier

from loading.assets import save_model
from pipelines.toy.models import to_pixels
from pipelines.toy.video import (
    CANVAS,
    EMBEDDED_VIDEO_FLOW,
    FRAMES,
    NUM_DIRECTIONS,
    SPEED,
    MovingDigitFlowModel,
    load_video_flow_model,
    random_starts,
    render_clips,
    save_video_model,
)
from reward_models.moving_digits import MovingDigitJudge, MovingDigitReward
from samplers import FlowODESampler, flow_sigmas
from tasks.video_digits import (
    EMBEDDED_VIDEO_CLASSIFIER,
    EMBEDDED_VIDEO_JUDGE,
    VIDEO_EVAL_PROMPTS,
    parse_video_prompt,
)

OUT_DIR = REPO_ROOT / "genrl" / "assets" / "video_digits"
COMMAND = "python scripts/build_video_assets.py"
FILE_NAME = Path(EMBEDDED_VIDEO_FLOW).name

MODEL = {"hidden_dim": 256, "num_layers": 3, "frames": FRAMES, "size": CANVAS}
TRAIN: dict[str, Any] = {"seed": 0, "steps": 3000, "batch_size": 128, "lr": 1e-3}
TRAIN |= {"optimizer": "Adam", "time_sampling": "s ~ U(0, 1)", "label_dropout": 0.1}
# Fractions of digit labels and of direction labels replaced by uniformly random ones.
TRAIN |= {"label_noise": 0.3, "direction_noise": 0.3, "eval_every": 500}
TRAIN |= {"accept_reward": [0.3, 0.7]}
EVAL: dict[str, Any] = {
    "prompts": "VIDEO_EVAL_PROMPTS (40)",
    "samples_per_prompt": 8,
    "noise_seed": 1234,
}
EVAL |= {"num_steps": 10, "sigmas": "flow_sigmas(10), no shift", "guidance": 1.0}
EVAL |= {"reward": "moving_digit (tidy * (0.5 digit + 0.5 motion))"}
EVAL |= {"judge": "moving_digit_judge (weight 0)"}


def eval_labels() -> tuple[list[str], torch.Tensor, torch.Tensor]:
    """The held-out prompts in sample order and their (digit, direction) labels ``[320]``."""
    per = EVAL["samples_per_prompt"]
    n = len(VIDEO_EVAL_PROMPTS) * per
    prompts = [VIDEO_EVAL_PROMPTS[i % len(VIDEO_EVAL_PROMPTS)] for i in range(n)]
    labels = torch.tensor([parse_video_prompt(p) for p in prompts])
    return prompts, labels[:, 0], labels[:, 1]


@torch.no_grad()
def heldout_scores(
    model: MovingDigitFlowModel, reward: MovingDigitReward, guidance: float = 1.0
) -> dict[str, float]:
    """Mean of every reward score over the held-out protocol's 320 ODE samples."""
    prompts, digits, directions = eval_labels()
    x = torch.randn(len(prompts), *model.event_shape, generator=torch.Generator().manual_seed(1234))
    sampler = FlowODESampler(flow_sigmas(EVAL["num_steps"]))
    null_d, null_k = torch.full_like(digits, 10), torch.full_like(directions, NUM_DIRECTIONS)
    for i in range(sampler.num_steps):
        sigma = sampler.sigmas[i].expand(len(prompts))
        v = model(x, sigma, digits, directions)
        if guidance != 1.0:
            v_null = model(x, sigma, null_d, null_k)
            v = v_null + guidance * (v - v_null)
        x = sampler.step(v, i, x).prev_sample
    scores = reward(to_pixels(x), prompts).scores
    return {k: round(float(v.mean()), 6) for k, v in scores.items()}


def train(data: dict[str, torch.Tensor], reward: MovingDigitReward) -> tuple[Any, dict]:
    torch.manual_seed(TRAIN["seed"])  # parameter initialisation
    gen = torch.Generator().manual_seed(TRAIN["seed"])
    model = MovingDigitFlowModel(**MODEL)
    optimizer = torch.optim.Adam(model.parameters(), lr=TRAIN["lr"])
    digits01, labels_all = data["train_images"][:, 0] / 16.0, data["train_labels"]
    history: list[list[float]] = []
    batch = TRAIN["batch_size"]
    for step in range(1, TRAIN["steps"] + 1):
        idx = torch.randint(0, len(labels_all), (batch,), generator=gen)
        directions = torch.randint(0, NUM_DIRECTIONS, (batch,), generator=gen)
        x0 = render_clips(digits01[idx], directions, random_starts(directions, gen)) * 2 - 1
        digits = labels_all[idx]
        # Label noise (what leaves RL its headroom), then label dropout (for CFG).
        swap = torch.rand(batch, generator=gen) < TRAIN["label_noise"]
        digits = torch.where(swap, torch.randint(0, 10, (batch,), generator=gen), digits)
        swap = torch.rand(batch, generator=gen) < TRAIN["direction_noise"]
        random_dirs = torch.randint(0, NUM_DIRECTIONS, (batch,), generator=gen)
        directions = torch.where(swap, random_dirs, directions)
        drop = torch.rand(batch, generator=gen) < TRAIN["label_dropout"]
        digits = torch.where(drop, torch.full_like(digits, 10), digits)
        directions = torch.where(drop, torch.full_like(directions, NUM_DIRECTIONS), directions)
        s = torch.rand(batch, generator=gen)
        eps = torch.randn(x0.shape, generator=gen)
        s5 = s.view(-1, 1, 1, 1, 1)
        # x0-prediction loss: the velocity loss is this one weighted by 1 / s^2, which the
        # small noise levels would dominate.
        loss = F.mse_loss(model.clean((1 - s5) * x0 + s5 * eps, s, digits, directions), x0)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if step % TRAIN["eval_every"] == 0:
            scores = heldout_scores(model, reward)
            history.append([step, scores["moving_digit"]])
            print(f"  step {step:5d}  loss {loss.item():.4f}  held-out {scores}", flush=True)
    return model.eval(), {"final_train_loss": round(loss.item(), 6), "reward_history": history}


def build(out: Path) -> dict[str, Any]:
    start = time.perf_counter()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    data = load_split()
    out.mkdir(parents=True, exist_ok=True)
    classifier, classifier_metrics = train_reward_classifier(data)
    print(f"reward classifier: {classifier_metrics}", flush=True)
    judge, judge_metrics = train_judge(data)
    print(f"judge: {judge_metrics}", flush=True)
    classifier_path = out / Path(EMBEDDED_VIDEO_CLASSIFIER).name
    judge_path = out / Path(EMBEDDED_VIDEO_JUDGE).name
    save_model(classifier, classifier_path)
    save_model(judge, judge_path)
    reward = MovingDigitReward(path=str(classifier_path))
    model, metrics = train(data, reward)
    metrics["train_seconds"] = round(time.perf_counter() - start, 1)
    save_video_model(model, out / FILE_NAME)
    shipped = load_video_flow_model(out / FILE_NAME)  # float16-rounded: what users get
    judged = MovingDigitJudge(path=str(judge_path))
    metrics["heldout"] = heldout_scores(shipped, reward)
    metrics["heldout_judge"] = heldout_scores(shipped, judged)
    metrics["heldout_cfg3"] = heldout_scores(shipped, reward, guidance=3.0)
    metrics["heldout_cfg3_judge"] = heldout_scores(shipped, judged, guidance=3.0)
    for key in ("heldout", "heldout_judge", "heldout_cfg3", "heldout_cfg3_judge"):
        print(f"{key}: {metrics[key]}")
    low, high = TRAIN["accept_reward"]
    if not low <= metrics["heldout"]["moving_digit"] <= high:
        raise RuntimeError(f"held-out reward {metrics['heldout']} outside [{low}, {high}]")
    manifest = {
        "description": "Tiny moving-digit clip flow model of the embedded video task "
        f"({FRAMES} frames of {CANVAS}x{CANVAS}, {SPEED} px/frame, float16 storage)",
        "command": COMMAND,
        "data": {"source": "sklearn.datasets.load_digits (training split)", "split": SPLIT},
        "model": {**MODEL, "parameters": sum(p.numel() for p in model.parameters())},
        "training": TRAIN,
        "reward_classifier": {**REWARD_CLASSIFIER, "metrics": classifier_metrics},
        "judge": {**JUDGE, "metrics": judge_metrics},
        "heldout_reward_protocol": EVAL,
        "metrics": metrics,
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
