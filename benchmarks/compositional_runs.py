"""One run of the compositional benchmark (``benchmarks/compositional.py``): what it trains
(``RunSpec``: method, track, setting, seed, schedule, held-out or tuning split), its cache name,
and its curve read back from ``metrics.jsonl``.

Tracks: ``geneval`` trains on the GenEval-rule reward (the ``compositional`` reward's default,
as the papers train), ``strict`` on its ``exact`` mode (``strict: true``: correct and nothing
extra on the canvas). Every run logs both scores on its evaluation prompts, so each track's
results hold both.

Cache names: ``<method>[-<track>][-lr<f>-<knob><v>]-seed<k>-it<N>-ev<M>[-quick]``, the track
left out for ``geneval`` and the setting left out for the recipe's own, so that entries written
before tracks and settings existed (``benchmarks/results/compositional_it200``) read as the
``geneval`` track at the recipe's settings; tuning runs (on the validation split) start with
``tune-``.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from cached_runs import write_result

TRACKS = ("geneval", "strict")
"""Training tracks: the reward the run trains on (GenEval's rule or ``exact``)."""

# name -> (recipe, label, colour)
METHODS: dict[str, tuple[str, str, str]] = {
    "flow_grpo": ("compositional_flow_grpo", "Flow-GRPO", "tab:blue"),
    "flow_grpo_fast": ("compositional_flow_grpo_fast", "Flow-GRPO-Fast", "tab:cyan"),
    "mix_grpo": ("compositional_mix_grpo", "MixGRPO", "tab:orange"),
    "cps": ("compositional_cps", "CPS", "tab:brown"),
    "dance_grpo": ("compositional_dance_grpo", "DanceGRPO", "tab:pink"),
    "branch_grpo": ("compositional_branch_grpo", "BranchGRPO", "tab:gray"),
    "ram": ("compositional_ram", "RAM", "tab:red"),
    "gdro": ("compositional_gdro", "GDRO (online)", "tab:green"),
    "gdro_offline": ("compositional_gdro_offline", "GDRO (offline store)", "tab:olive"),
    "diffusion_nft": ("compositional_diffusion_nft", "DiffusionNFT", "tab:purple"),
    "dgpo": ("compositional_dgpo", "DGPO", "black"),
    "awm": ("compositional_awm", "AWM", "gold"),
}


@dataclass(frozen=True)
class Setting:
    """A point of a method's tuning grid: the learning rate as a factor of the recipe's, and the
    value of the method's knob (``compositional_methods.TUNING_KNOBS``)."""

    lr_factor: float
    """Learning rate / the recipe's learning rate."""
    value: float
    """Value of the method's knob."""


def knob(method: str) -> Any:
    """The method's ``Knob`` (its tuning field and values)."""
    from genrl.recipes.compositional_methods import TUNING_KNOBS

    return TUNING_KNOBS[METHODS[method][0]]


def recipe_setting(method: str) -> Setting:
    """The recipe's own setting: its learning rate and its knob's value."""
    from genrl import get_recipe

    section, field = knob(method).field.split(".")
    return Setting(1.0, float(getattr(getattr(get_recipe(METHODS[method][0]), section), field)))


@dataclass(frozen=True)
class RunSpec:
    """Everything that makes a run what it is (and names its cache entry)."""

    method: str
    """Key of ``METHODS``."""
    track: str
    """One of ``TRACKS``."""
    seed: int
    """Training seed (``seed=``)."""
    iterations: int
    """``train.iterations``."""
    eval_every: int
    """``eval.every``."""
    quick: bool = False
    """Smoke size: 4 prompts per iteration, 2 evaluation samples per prompt."""
    setting: Setting | None = None
    """None: the recipe's settings; else a point of the tuning grid."""
    tuning: bool = False
    """Train on the tuning split and evaluate on the validation prompts
    (``prompts.dataset=compositional_tuning``) instead of the held-out ones."""

    def key(self) -> str:
        name = self.method + ("" if self.track == "geneval" else f"-{self.track}")
        if self.setting is not None and self.setting != recipe_setting(self.method):
            field = knob(self.method).field.rsplit(".", 1)[-1]
            name += f"-lr{self.setting.lr_factor:g}-{field}{self.setting.value:g}"
        name = ("tune-" if self.tuning else "") + name
        schedule = f"-seed{self.seed}-it{self.iterations}-ev{self.eval_every}"
        return name + schedule + ("-quick" if self.quick else "")

    def overrides(self, base_lr: float) -> list[str]:
        """The ``--set`` overrides of this run on top of its recipe."""
        out = [f"seed={self.seed}", f"train.iterations={self.iterations}"]
        out += [f"eval.every={self.eval_every}"]
        if self.track == "strict":
            out.append('reward.0.kwargs={"strict": true}')
        if self.tuning:
            out.append("prompts.dataset=compositional_tuning")
        if self.setting is not None:
            out.append(f"optim.lr={base_lr * self.setting.lr_factor!r}")
            out.append(f"{knob(self.method).field}={self.setting.value!r}")
        if self.quick:  # a smoke run: fewer prompts per iteration and samples per prompt
            out += ["train.prompts_per_iteration=4", "eval.samples_per_prompt=2"]
        return out


def settings_of(method: str, setting: Setting | None, source: str) -> dict[str, Any]:
    """The JSON ``settings`` of a method: learning rate, knob and where they come from."""
    from genrl import get_recipe

    chosen = setting or recipe_setting(method)
    base_lr = get_recipe(METHODS[method][0]).optim.lr
    return {
        "lr": base_lr * chosen.lr_factor,
        "lr_factor": chosen.lr_factor,
        knob(method).field: chosen.value,
        "source": source,
    }


def read_cached(path: Path) -> dict[str, Any]:
    """A cached result; entries written before tracks existed read as the ``geneval`` track
    at the recipe's settings (their ``final`` is the GenEval-rule score, and their curve points
    have no ``exact`` column)."""
    result = json.loads(path.read_text())
    result.setdefault("track", "geneval")
    result.setdefault("setting", None)
    result.setdefault("final_exact", result["after"].get("compositional/exact"))
    return {**result, "cached": True}


def train_one(spec: RunSpec, out: Path, keep: bool) -> dict[str, Any]:
    """Train ``spec`` (or read its cached result); returns its curve and finals.

    The curve is a list of points ``[iteration, optimizer steps, training seconds, GenEval-rule
    score, exact score]``, the first before training (at the store fill's seconds for offline
    GDRO)."""
    key = spec.key()
    cache = out / "results" / f"{key}.json"
    if cache.is_file():
        return read_cached(cache)
    from genrl import Trainer, get_recipe
    from genrl.reporting.metrics import read_metrics

    run_dir, store = out / "runs" / key, out / "runs" / f"{key}-store"
    config = get_recipe(METHODS[spec.method][0])
    overrides = [
        *spec.overrides(config.optim.lr),
        "logging.progress_bar=false",
        "logging.tensorboard=false",
        "logging.log_every=100000",
        "logging.checkpoint_every=0",
    ]
    if config.train.offline_store:
        # The store holds the run's whole sample budget (see compositional_methods.py); an
        # unfinished earlier fill is dropped so that the fill's seconds are all measured.
        shutil.rmtree(store, ignore_errors=True)
        per = 4 if spec.quick else config.train.prompts_per_iteration
        overrides += [f"train.offline_store={store}"]
        overrides += [f"train.offline_groups={spec.iterations * per}"]
    config.apply_overrides(overrides)
    (out / "logs").mkdir(parents=True, exist_ok=True)
    with (
        open(out / "logs" / f"{key}.log", "w", encoding="utf-8") as log,
        contextlib.redirect_stdout(log),
    ):
        trainer = Trainer(config, run_dir=run_dir, overwrite=True)
        started = time.perf_counter()
        trainer.collector.fill_offline_store()
        fill_s = time.perf_counter() - started if config.train.offline_store else 0.0
        summary = trainer.train()
    after = summary["heldout_scores_after"]
    result = {
        "method": spec.method,
        "recipe": config.recipe,
        "track": spec.track,
        "setting": None if spec.setting is None else asdict(spec.setting),
        "tuning": spec.tuning,
        "seed": spec.seed,
        "curve": read_curve(read_metrics(run_dir / "metrics.jsonl"), fill_s),
        "fill_seconds": fill_s,
        "before": summary["heldout_scores_before"],
        "after": after,
        "final": after["compositional/correct"],
        "final_exact": after["compositional/exact"],
        "optimizer_steps": summary["optimizer_steps"],
        "samples_seen": summary["samples_seen"],
        "offline_samples": config.train.offline_groups * config.train.group_size,
    }
    write_result(cache, result)  # a killed run leaves no half-written cache entry
    if not keep:
        shutil.rmtree(run_dir, ignore_errors=True)
        shutil.rmtree(store, ignore_errors=True)
    return {**result, "cached": False}


def read_curve(rows: list[dict[str, Any]], start_seconds: float) -> list[list[float]]:
    """Evaluation points from ``metrics.jsonl`` rows: the before row (iteration 0, evaluation
    only), the iterations with an evaluation, and the final evaluation (its own row after the
    last iteration's). Seconds add up ``time/iteration_s``, so evaluation time is left out.
    Both scores come from the ``compositional`` reward's ``correct`` and ``exact``, whichever
    one the run trains on."""
    steps, seconds = 0.0, start_seconds
    points: list[list[float]] = []
    for row in rows:
        if "time/iteration_s" in row:
            seconds += row["time/iteration_s"]
            steps = row["optimizer_steps"]
        if "eval/reward" in row:
            geneval = float(row["eval/compositional/correct"])
            point = [float(row["iteration"]), steps, seconds, geneval]
            point.append(float(row["eval/compositional/exact"]))
            if points and points[-1][0] == point[0]:
                points[-1] = point
            else:
                points.append(point)
    return points
