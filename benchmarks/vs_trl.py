"""genrl's GRPO step against TRL's ``GRPOTrainer`` on the same tiny causal LM.

Both sides train the embedded Countdown model (``genrl/assets/countdown_lm``: a tiny
Qwen3 with a character tokenizer), loaded from the same directory in float32 on the CPU, full
fine-tuning, with:

* the same prompts: generation batch ``k`` of both holds the prompts of genrl's iteration ``k``
  (``PromptSource.sample(P, seed, k)``; TRL reads them in order, ``shuffle_dataset=False``);
* the same reward: the TRL-style callable ``tasks.countdown.countdown_reward``, handed to
  TRL as a reward function and to genrl through ``reward_models.CallableReward``;
* the same settings: ``P`` prompts x ``G`` completions per generation batch, 8 new tokens at
  temperature 1 (top-k/top-p off), no KL (beta 0), the per-sequence token-mean loss (TRL
  ``loss_type="grpo"``, genrl ``aggregation="sequence_mean"``), clip 0.2, group-std advantages
  (sample std, eps 1e-4), torch's AdamW with the same lr, betas and eps and no weight decay,
  gradient clipping at 1, a constant lr, dropout off, one pass over each generation batch (TRL
  ``num_iterations=1``, genrl ``inner_epochs=1``).

A configuration ``PxG`` trains the ``P*G`` completions in one minibatch and one optimizer step
(TRL ``per_device_train_batch_size=P*G``; genrl ``minibatch_size=P*G``); ``/accA`` splits the
step into ``A`` accumulated minibatches (TRL ``gradient_accumulation_steps=A``; genrl the same
name); ``/stepsS`` trains the batch in ``S`` optimizer steps (TRL ``steps_per_generation=A*S``;
genrl ``minibatch_size=P*G/(A*S)``). With one step neither library runs a separate old-log-prob
forward (TRL skips ``old_per_token_logps``, genrl ``updates_once``); with ``S > 1`` both do.

For each configuration one process runs TRL's own training loop (``trainer.train()``) and, from
a callback after the last TRL optimizer step of every generation batch, one genrl iteration
(``Trainer.train_iteration``: prompts, generation, reward, advantages, loss, backward, clipping,
AdamW, metrics), so the two alternate round by round under the same load. A TRL round is the
wall time from the end of one round to the end of the next, less the genrl iteration run in
between: batch fetch, generation, reward, loss, backward, clipping, optimizer and scheduler
steps and TRL's logging (``logging_steps=1``, to no tracker). The first ``--warmup`` rounds of
each are dropped; the headline ``genrl_over_trl_step_time`` is the ratio of the median round
times (target <= 1.0), and ``paired_ratio`` the median of the per-round ratios (each genrl
iteration over the TRL round just before it), which is less sensitive to load from other
processes. Phases (generation, no-grad log-prob forwards, reward, the training forward, the rest
of the loss, backward, clipping, optimizer steps, and the rest) are timed per round by wrapping
the calls both libraries make, so the tables say where a difference comes from.

TRL runs offline (``HF_HUB_OFFLINE``), reports nowhere (``report_to="none"``), prints no logs
and writes its output directory into a temporary directory. It comes with the ``bench`` extra:
``pip install -c constraints.txt -e .[bench]``.

Usage::

    python benchmarks/vs_trl.py                  # 1x8 4x16 4x16/acc4 4x16/steps2; 30 rounds
    python benchmarks/vs_trl.py --quick          # smoke run, a few rounds
    python benchmarks/vs_trl.py --configs 2x8 8x8/acc2 --rounds 40

The last line of output is one JSON object (benchmarks/README.md).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from timing import PhaseTimer  # benchmarks/timing.py

# Offline, quiet, no telemetry and no experiment trackers: set before transformers, datasets and
# TRL are imported (genrl imports none of them at import time).
for _name, _value in {
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "TRANSFORMERS_VERBOSITY": "error",
    "WANDB_DISABLED": "true",
    "WANDB_MODE": "disabled",
    "TOKENIZERS_PARALLELISM": "false",
}.items():
    os.environ.setdefault(_name, _value)

# Measure this checkout's genrl, not another one the environment may have installed in
# editable mode (a script's sys.path starts at benchmarks/, not at the repository root).
ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from genrl.algorithms.grpo import GRPOConfig
from genrl.run.config import (
    EvalConfig,
    GenerationConfig,
    LoggingConfig,
    OptimConfig,
    PolicyConfig,
    PromptConfig,
    RewardSpec,
    TrainConfig,
    TrainLoopConfig,
)
from pipelines.transformers.causal_lm import EMBEDDED_COUNTDOWN_LM
from reward_models import REWARDS, CallableReward
from tasks.countdown import MAX_COMPLETION_CHARS, countdown_reward

TARGET_RATIO = 1.0
DEFAULT_CONFIGS = ("1x8", "4x16", "4x16/acc4", "4x16/steps2")
REWARD_NAME = "countdown_fn"
# Phases timed on both sides; "training forward" runs inside "loss", the others do not nest.
PHASES = (
    "generation",
    "no-grad forward",
    "reward",
    "training forward",
    "loss",
    "backward",
    "clip",
    "optimizer",
)
TOP_LEVEL = ("generation", "no-grad forward", "reward", "loss", "backward", "clip", "optimizer")


@dataclass(frozen=True)
class Setup:
    """``prompts`` x ``group_size`` completions per generation batch, trained in ``steps``
    optimizer steps of ``accumulation`` minibatches each."""

    prompts: int
    group_size: int
    accumulation: int = 1
    steps: int = 1

    @property
    def name(self) -> str:
        name = f"{self.prompts}x{self.group_size}"
        if self.accumulation > 1:
            name += f"/acc{self.accumulation}"
        if self.steps > 1:
            name += f"/steps{self.steps}"
        return name

    @property
    def samples(self) -> int:
        return self.prompts * self.group_size

    @property
    def minibatch(self) -> int:
        return self.samples // (self.accumulation * self.steps)


def parse_setup(text: str) -> Setup:
    match = re.fullmatch(r"(\d+)x(\d+)(?:/acc(\d+))?(?:/steps(\d+))?", text)
    if match is None:
        raise argparse.ArgumentTypeError(
            f"configuration {text!r} is not PxG, PxG/accA, PxG/stepsS or PxG/accA/stepsS"
        )
    prompts, group = int(match[1]), int(match[2])
    accumulation, steps = int(match[3] or 1), int(match[4] or 1)
    if prompts < 1 or group < 2 or accumulation < 1 or steps < 1:
        raise argparse.ArgumentTypeError(f"configuration {text!r}: need P >= 1, G >= 2, A, S >= 1")
    if (prompts * group) % (accumulation * steps):
        raise argparse.ArgumentTypeError(f"configuration {text!r}: A * S must divide P * G")
    return Setup(prompts, group, accumulation, steps)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--configs",
        type=parse_setup,
        nargs="+",
        default=[parse_setup(s) for s in DEFAULT_CONFIGS],
        help="PxG: P prompts x G completions in one minibatch and one optimizer step; "
        "/accA: A accumulated minibatches per step; /stepsS: S optimizer steps per "
        f"generation batch (default: {' '.join(DEFAULT_CONFIGS)})",
    )
    parser.add_argument("--rounds", type=int, default=30, help="timed rounds of each (default: 30)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed rounds of each (default: 3)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default: 1)")
    parser.add_argument(
        "--lr",
        type=float,
        default=1e-5,
        help="learning rate of both (default: 1e-5, small so that both policies stay near the "
        "embedded model and sample completions of the same lengths)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of both (default: 0)")
    parser.add_argument(
        "--quick", action="store_true", help="smoke run: 4 rounds, 1 warm-up (unless given)"
    )
    args = parser.parse_args(argv)
    given = argv if argv is not None else sys.argv[1:]
    if args.quick:
        if "--rounds" not in given:
            args.rounds = 4
        if "--warmup" not in given:
            args.warmup = 1
    if args.rounds < 1 or args.warmup < 0 or args.threads < 1:
        parser.error("--rounds and --threads must be >= 1, --warmup >= 0")
    return args


def grad_phase() -> str:
    """Scoring calls under ``no_grad`` are the old/reference forward, the others training's."""
    return "training forward" if torch.is_grad_enabled() else "no-grad forward"


# -- genrl ------------------------------------------------------------------------------------
def build_genrl(setup: Setup, args: argparse.Namespace, directory: Path) -> tuple[Any, PhaseTimer]:
    from genrl.loop.trainer import Trainer

    REWARDS[REWARD_NAME] = lambda: CallableReward(countdown_reward, name=REWARD_NAME)
    steps = args.warmup + args.rounds
    config = TrainConfig(
        recipe="vs_trl",
        seed=args.seed,
        output_dir=str(directory),
        policy=PolicyConfig(name="causal_lm", pretrained=str(EMBEDDED_COUNTDOWN_LM)),
        generation=GenerationConfig(max_new_tokens=MAX_COMPLETION_CHARS + 1, temperature=1.0),
        reward=[RewardSpec(name=REWARD_NAME)],
        algorithm=GRPOConfig(
            clip_range=0.2,
            aggregation="sequence_mean",
            kl_beta=0.0,
            std_mode="group",
            std_estimator="sample",
            std_eps=1e-4,
        ),
        prompts=PromptConfig(dataset="countdown"),
        train=TrainLoopConfig(
            iterations=steps,
            prompts_per_iteration=setup.prompts,
            group_size=setup.group_size,
            inner_epochs=1,
            minibatch_size=setup.minibatch,  # S * A minibatches: S optimizer steps
            gradient_accumulation_steps=setup.accumulation,
        ),
        optim=OptimConfig(lr=args.lr, weight_decay=0.0, max_grad_norm=1.0, lr_schedule="constant"),
        eval=EvalConfig(samples_per_prompt=1, batch_size=setup.samples),
        logging=LoggingConfig(tensorboard=False, progress_bar=False),
    )
    trainer = Trainer(config)
    timer = PhaseTimer(torch.device("cpu"))
    timer.wrap(trainer.policy, "generate", "generation")
    timer.wrap(trainer.policy, "token_log_probs", grad_phase)
    timer.wrap(trainer.reward, "score", "reward")
    timer.wrap(trainer.objective, "loss", "loss")
    timer.wrap(trainer.accelerator, "backward", "backward")
    timer.wrap(trainer.accelerator, "clip_grad_norm_", "clip")
    timer.wrap(trainer.updater.optimizer, "step", "optimizer")
    return trainer, timer


def genrl_prompts(trainer: Any, steps: int) -> list[str]:
    """The prompts genrl's iterations ``0 .. steps - 1`` draw, in order."""
    t = trainer.config.train
    return [
        prompt
        for k in range(steps)
        for prompt in trainer.prompts.sample(t.prompts_per_iteration, trainer.config.seed, k)
    ]


# -- TRL --------------------------------------------------------------------------------------
def build_trl(
    setup: Setup, args: argparse.Namespace, prompts: list[str], directory: Path, callback: Any
) -> tuple[Any, PhaseTimer]:
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, PrinterCallback
    from trl import GRPOConfig as TRLConfig
    from trl import GRPOTrainer

    fields = getattr(TRLConfig, "__dataclass_fields__", {})
    name = (
        "activation_checkpointing"
        if "activation_checkpointing" in fields
        else "gradient_checkpointing"
    )
    checkpointing_off = {name: False}
    model = AutoModelForCausalLM.from_pretrained(str(EMBEDDED_COUNTDOWN_LM), dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(str(EMBEDDED_COUNTDOWN_LM))
    config = TRLConfig(
        output_dir=str(directory),
        report_to="none",
        use_cpu=True,
        bf16=False,
        fp16=False,
        # transformers 5 renamed gradient_checkpointing (TRL's default: on) to this.
        **checkpointing_off,
        seed=args.seed,
        max_steps=(args.warmup + args.rounds) * setup.steps,
        per_device_train_batch_size=setup.minibatch,
        gradient_accumulation_steps=setup.accumulation,
        steps_per_generation=setup.accumulation * setup.steps,
        num_generations=setup.group_size,
        num_iterations=1,
        shuffle_dataset=False,
        max_completion_length=MAX_COMPLETION_CHARS + 1,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        beta=0.0,
        epsilon=0.2,
        loss_type="grpo",
        scale_rewards="group",
        learning_rate=args.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        max_grad_norm=1.0,
        optim="adamw_torch",
        disable_dropout=True,
        logging_steps=1,
        disable_tqdm=True,
        save_strategy="no",
        log_completions=False,
        dataloader_num_workers=0,
    )
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=[countdown_reward],
        args=config,
        train_dataset=Dataset.from_dict({"prompt": prompts}),
        processing_class=tokenizer,
        callbacks=[callback],
    )
    trainer.remove_callback(PrinterCallback)  # no log lines on stdout
    if trainer.args.gradient_checkpointing or trainer.args.bf16 or trainer.args.fp16:
        raise RuntimeError("TRL must run without gradient checkpointing and in float32")
    timer = PhaseTimer(torch.device("cpu"))
    timer.wrap(trainer.model, "generate", "generation")
    timer.wrap(trainer, "_get_per_token_logps_and_entropies", grad_phase)
    timer.wrap(trainer, "_calculate_rewards", "reward")
    timer.wrap(trainer, "compute_loss", "loss")
    timer.wrap(trainer.accelerator, "backward", "backward")
    timer.wrap(trainer.accelerator, "clip_grad_norm_", "clip")
    return trainer, timer


# -- the interleaved rounds ------------------------------------------------------------------
class Rounds:
    """Called at the end of every TRL optimizer step; after the last step of a generation batch
    it closes TRL's round and runs and times one genrl iteration (the same generation batch and
    optimizer steps). Phase times are per round (differences of the timers' totals)."""

    def __init__(self, genrl: Any, genrl_timer: PhaseTimer, steps_per_round: int) -> None:
        self.genrl = genrl
        self.steps_per_round = steps_per_round
        self._trl_steps = 0
        self._trl_length = 0.0
        self.timers = {"genrl": genrl_timer}
        self.steps: dict[str, list[float]] = {"genrl": [], "trl": []}
        self.phases: dict[str, list[dict[str, float]]] = {"genrl": [], "trl": []}
        self.lengths: dict[str, list[float]] = {"genrl": [], "trl": []}
        self.trl: Any = None
        self._mark = 0.0
        self._before: dict[str, dict[str, float]] = {}

    def attach(self, trl: Any, trl_timer: PhaseTimer) -> None:
        self.trl = trl
        self.timers["trl"] = trl_timer

    def _phase_delta(self, side: str) -> dict[str, float]:
        now = dict(self.timers[side].seconds)
        before = self._before.get(side, {})
        self._before[side] = now
        return {p: now.get(p, 0.0) - before.get(p, 0.0) for p in PHASES}

    def begin(self) -> None:
        """Training starts: the optimizer exists now (wrapped here) and the first step's clock."""
        self.timers["trl"].wrap(self.trl.optimizer, "step", "optimizer")
        self._phase_delta("trl")
        self._phase_delta("genrl")
        self._mark = time.perf_counter()

    def trl_step_done(self) -> None:
        # TRL logs (and clears its metrics) after every optimizer step: read the length of the
        # batch's completions after the step that generated them.
        lengths = self.trl._metrics["train"].get("completions/mean_length")
        if lengths:
            self._trl_length = float(lengths[-1])
        self._trl_steps += 1
        if self._trl_steps % self.steps_per_round:
            return
        end = time.perf_counter()
        self.steps["trl"].append(end - self._mark)
        self.phases["trl"].append(self._phase_delta("trl"))
        self.lengths["trl"].append(self._trl_length)

        start = time.perf_counter()
        metrics = self.genrl.train_iteration()
        self.steps["genrl"].append(time.perf_counter() - start)
        self.phases["genrl"].append(self._phase_delta("genrl"))
        self.lengths["genrl"].append(float(metrics.get("loss/completion_length", float("nan"))))
        self._mark = time.perf_counter()


def make_callback(rounds: Rounds) -> Any:
    from transformers import TrainerCallback

    class Interleave(TrainerCallback):
        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            rounds.begin()

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            rounds.trl_step_done()

    return Interleave()


def quartiles(values: list[float]) -> tuple[float, float]:
    if len(values) < 2:
        return values[0], values[0]
    q = statistics.quantiles(values, n=4)
    return q[0], q[2]


def summarize(setup: Setup, rounds: Rounds, warmup: int) -> dict[str, Any]:
    result: dict[str, Any] = {
        "prompts": setup.prompts,
        "group_size": setup.group_size,
        "minibatch_size": setup.minibatch,
        "accumulation": setup.accumulation,
        "optimizer_steps": setup.steps,
    }
    medians = {}
    for side in ("genrl", "trl"):
        times = rounds.steps[side][warmup:]
        medians[side] = statistics.median(times)
        q1, q3 = quartiles(times)
        phases = {p: statistics.median(r[p] for r in rounds.phases[side][warmup:]) for p in PHASES}
        per_round_other = [
            step - sum(r[p] for p in TOP_LEVEL)
            for step, r in zip(times, rounds.phases[side][warmup:], strict=True)
        ]
        phases["loss without forward"] = statistics.median(
            r["loss"] - r["training forward"] for r in rounds.phases[side][warmup:]
        )
        phases["other"] = statistics.median(per_round_other)
        result[side] = {
            "median_ms": round(medians[side] * 1e3, 3),
            "p25_ms": round(q1 * 1e3, 3),
            "p75_ms": round(q3 * 1e3, 3),
            "phases_ms": {k: round(v * 1e3, 3) for k, v in phases.items()},
            "completion_length": round(statistics.fmean(rounds.lengths[side][warmup:]), 3),
        }
    paired = [
        g / t
        for g, t in zip(rounds.steps["genrl"][warmup:], rounds.steps["trl"][warmup:], strict=True)
    ]
    p1, p3 = quartiles(paired)
    result["genrl_over_trl_step_time"] = round(medians["genrl"] / medians["trl"], 4)
    result["paired_ratio"] = {
        "median": round(statistics.median(paired), 4),
        "p25": round(p1, 4),
        "p75": round(p3, 4),
    }
    return result


def measure(setup: Setup, args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    genrl, genrl_timer = build_genrl(setup, args, tmp / f"genrl-{setup.name.replace('/', '_')}")
    rounds = Rounds(genrl, genrl_timer, setup.steps)
    prompts = genrl_prompts(genrl, args.warmup + args.rounds)
    trl, trl_timer = build_trl(
        setup, args, prompts, tmp / f"trl-{setup.name.replace('/', '_')}", make_callback(rounds)
    )
    rounds.attach(trl, trl_timer)
    with genrl_timer.installed(), trl_timer.installed():
        trl.train()
    done = len(rounds.steps["trl"])
    if done != args.warmup + args.rounds:
        raise RuntimeError(f"TRL ran {done} rounds, expected {args.warmup + args.rounds}")
    return summarize(setup, rounds, args.warmup)


def print_table(results: dict[str, dict[str, Any]], args: argparse.Namespace) -> None:
    print(
        "One generation batch: generation, reward, advantages, loss, backward and optimizer "
        f"step(s); median of {args.rounds} interleaved rounds after {args.warmup} warm-ups, "
        f"{args.threads} thread(s):"
    )
    width = max(len(name) for name in results) + 2
    header = (
        f"{'config':>{width}}  {'genrl ms [p25-p75]':>22}  {'TRL ms [p25-p75]':>22}  "
        f"{'genrl/TRL':>9}  {'paired [p25-p75]':>21}"
    )
    print(header)
    print("-" * len(header))
    for name, r in results.items():
        g, t, p = r["genrl"], r["trl"], r["paired_ratio"]
        print(
            f"{name:>{width}}  {g['median_ms']:>8.1f} [{g['p25_ms']:>5.1f}-{g['p75_ms']:>5.1f}]  "
            f"{t['median_ms']:>8.1f} [{t['p25_ms']:>5.1f}-{t['p75_ms']:>5.1f}]  "
            f"{r['genrl_over_trl_step_time']:>9.3f}  "
            f"{p['median']:>6.3f} [{p['p25']:.3f}-{p['p75']:.3f}]"
        )
    print()
    rows = [*PHASES[:4], "loss without forward", *PHASES[5:], "other"]
    print("Median ms per round and phase, genrl / TRL:")
    column = max(17, width)
    header = f"{'phase':>22}" + "".join(f"  {name:>{column}}" for name in results)
    print(header)
    print("-" * len(header))
    for phase in rows:
        cells = "".join(
            f"  {r['genrl']['phases_ms'][phase]:>7.2f} / {r['trl']['phases_ms'][phase]:>7.2f}".rjust(
                column + 2
            )
            for r in results.values()
        )
        print(f"{phase:>22}{cells}")
    cells = "".join(
        f"  {r['genrl']['completion_length']:>7.2f} / {r['trl']['completion_length']:>7.2f}".rjust(
            column + 2
        )
        for r in results.values()
    )
    print(f"{'completion tokens':>22}{cells}")
    print(
        f"genrl/TRL = ratio of the median round times (target <= {TARGET_RATIO}); paired = "
        "median of the per-round ratios. 'no-grad forward' is the old-log-prob forward; "
        "'training forward' runs inside the loss; 'other' is the round less the timed phases "
        "(tokenizing, decoding, advantages, metrics, TRL's batch fetch and logging)."
    )


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    wall_start = time.perf_counter()
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")  # TRL's and transformers' notices about CPU training
    try:
        import transformers
        import trl
    except ImportError as err:
        raise SystemExit(
            f"vs_trl needs TRL ({err}); install the bench extra: pip install -e '.[bench]'"
        ) from err

    transformers.utils.logging.set_verbosity_error()
    results = {}
    with tempfile.TemporaryDirectory(prefix="genrl-vs-trl-") as tmp:
        for setup in args.configs:
            results[setup.name] = measure(setup, args, Path(tmp))
    print_table(results, args)
    summary = {
        "benchmark": "vs_trl",
        "configurations": results,
        "genrl_over_trl_step_time": {
            name: r["genrl_over_trl_step_time"] for name, r in results.items()
        },
        "target": TARGET_RATIO,
        "rounds": args.rounds,
        "warmup": args.warmup,
        "threads": args.threads,
        "lr": args.lr,
        "max_new_tokens": MAX_COMPLETION_CHARS + 1,
        "versions": {
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "trl": trl.__version__,
        },
        "wall_seconds": round(time.perf_counter() - wall_start, 1),
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
