"""Typed configuration of a training run.

Every field is documented right under it. A run's config is a ``TrainConfig`` built by a recipe
(``genrl/recipes``) and adjusted with dotted overrides (``--set optim.lr=1e-4``); ``validate()``
rejects inconsistent settings with an error naming the field.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

from genrl.algorithms import ALGORITHMS
from genrl.algorithms.base import AlgorithmConfig
from genrl.allocation.configs import AllocationConfig, validate_allocation
from genrl.config.errors import ConfigError, unknown_message
from genrl.config.overrides import apply_override, parse_assignment, to_dict
from genrl.config.typed import check_finite
from genrl.rollouts.configs import DDIMSamplingConfig as DDIMSamplingConfig
from genrl.rollouts.configs import FlowSamplingConfig as FlowSamplingConfig
from genrl.rollouts.configs import GenerationConfig as GenerationConfig
from genrl.rollouts.configs import SDESamplingConfig as SDESamplingConfig
from genrl.rollouts.configs import StochasticSamplingConfig as StochasticSamplingConfig
from genrl.rollouts.configs import TokenGenerationConfig
from genrl.rollouts.configs import UnmaskingConfig as UnmaskingConfig
from genrl.run.config_checks import validate_offline, validate_sampling_modes
from genrl.run.replay_config import ReplayConfig

# Config sections that belong to the run's rollout; ``Algorithm.sections`` names their classes.
ROLLOUT_SECTIONS = ("sampler", "generation")


@dataclass
class PolicyConfig:
    name: str = "toy_digits"
    """Adapter in the policy registry (``genrl list`` shows them)."""
    pretrained: str | None = None
    """Local directory/file or hub id of the weights; None uses the adapter's embedded weights."""
    lora_rank: int = 0
    """LoRA rank through peft; 0 fine-tunes all parameters (the reference, when the algorithm
    uses one, is then a frozen copy; ``reference_offload`` keeps it on the CPU)."""
    lora_alpha: float = 0.0
    """LoRA scaling numerator; 0 means ``2 * lora_rank`` (Flow-GRPO: r 32, alpha 64)."""
    lora_target_modules: list[str] | None = None
    """Module names LoRA wraps; None uses the adapter's default (attention/linear projections)."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """Storage dtype of the frozen weights (base model, text encoders, VAE); trainable parameters
    stay float32. Anything but float32 needs ``train.mixed_precision`` (autocast)."""
    reference_offload: bool = False
    """Full fine-tuning with a reference (a KL term, RAM, GDRO): keep the frozen copy on the CPU
    and move it to the device only while it is used (saves one model's memory on the device,
    costs a host-to-device copy of its weights per use). No effect under LoRA, whose reference
    is the base model with the adapter off, or when the algorithm never uses a reference (no
    copy is made: e.g. ``kl_beta=0``)."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass (less memory, ~30% more compute)."""
    kwargs: dict[str, Any] = field(default_factory=dict)
    """Adapter-specific settings, e.g. ``{"height": 512, "width": 512}`` for diffusers models
    (``genrl list`` names each adapter; its docstring lists the keys)."""


@dataclass
class RewardSpec:
    name: str = "digit_classifier"
    """Reward model in the reward registry."""
    weight: float = 1.0
    """Weight of this reward's primary score in the training reward."""
    kwargs: dict = field(default_factory=dict)
    """Keyword arguments for the reward's constructor (e.g. a checkpoint path)."""


@dataclass
class PromptConfig:
    dataset: str = "digits"
    """Prompt set: a registered name, a text file (one prompt per line), a dataset file with
    columns (``.jsonl``, ``.csv``, ``.parquet``) or a Hugging Face dataset (``hf:NAME`` or
    ``hf:NAME:SPLIT``, or a local dataset folder); a dataset's other columns reach the rewards
    as keyword arguments (README, "Prompt datasets")."""
    eval_dataset: str | None = None
    """Held-out prompts for evaluation; None uses the dataset's own held-out split (a file or
    dataset: its own prompts)."""
    column: str = "prompt"
    """The column of a dataset that holds the prompt text (TRL: ``prompt``)."""


@dataclass
class TrainLoopConfig:
    iterations: int = 60
    """Outer iterations (rollout -> rewards -> update)."""
    prompts_per_iteration: int = 16
    """Groups per iteration over all processes (Flow-GRPO: 48)."""
    group_size: int = 8
    """Samples per prompt (Flow-GRPO: 24)."""
    inner_epochs: int = 1
    """Passes over each rollout (Flow-GRPO: 1)."""
    minibatch_size: int = 64
    """Training units (for Flow-GRPO: sample-timestep transitions) per forward, per process."""
    rollout_batch_size: int = 0
    """Samples per model forward in rollouts, per process (0: the whole local batch at once;
    lower it when a real model's batch does not fit in memory). Flow-GRPO's and the endpoint
    rollouts' rewards also score this many samples per call (``Rollout.chunks``)."""
    overlap_rewards: bool = False
    """Score each chunk of ``rollout_batch_size`` samples in a background thread while the
    rollout samples the next chunk (``genrl/loop/reward_overlap.py``) instead of after sampling;
    the rewards score the same chunks either way, so rewards, advantages and training are the
    same. Hides up to ``1 - 1/chunks`` of the reward time: it pays for rewards that wait (a
    reward server, an API) or run on another device, while a reward on the CPU competes with
    sampling for cores and torch's intra-op threads (``torch.set_num_threads``). Flow-GRPO and
    the endpoint rollouts (RAM, GDRO, DiffusionNFT) sample chunk by chunk; BranchGRPO's trees
    and the token rollouts sample the batch at once and are scored after it, as without the
    option. ``time/rollout_s`` then counts sampling and decoding until the last chunk is handed
    over, ``time/reward_s`` the wait for the last scores. Off by default: with
    ``rollout_batch_size=0`` there is one chunk, nothing to hide, and a cheap CPU reward loses
    more to thread handoffs than it hides (``benchmarks/README.md``)."""
    gradient_accumulation_steps: int = 1
    """Minibatches accumulated into one optimizer step."""
    mixed_precision: Literal["no", "fp16", "bf16"] = "no"
    """Autocast for model forwards; log-probs are always float32."""
    dynamic_sampling: bool = False
    """DAPO's dynamic sampling: drop groups whose ``dynamic_sampling_metric`` is the same for
    every sample (zero advantage, no gradient) and sample further prompts until
    ``prompts_per_iteration`` groups with differing rewards remain."""
    dynamic_sampling_max_rounds: int = 8
    """Hard cap on sampling rounds per iteration (each samples ``prompts_per_iteration`` groups);
    reaching it without enough varied groups saves a checkpoint and stops with an error."""
    dynamic_sampling_metric: str = ""
    """Score whose within-group spread decides, e.g. ``countdown/accuracy`` (DAPO filters on
    accuracy); empty: the combined reward."""
    offline_store: str = ""
    """Directory of an offline rollout store (``genrl/loop/offline.py``); when set, iterations train
    on groups read from it instead of sampling (algorithms that support it: GDRO), with the
    rewards recorded when the groups were sampled."""
    offline_groups: int = 0
    """Groups the offline store must hold (rounded up to whole ``prompts_per_iteration``
    batches); missing ones are sampled by the reference policy and scored before training,
    resumably. 0: train on what the store holds."""
    max_staleness: int = 0
    """Asynchronous rollouts (``genrl/loop/staleness.py``): 0 samples each iteration from the
    weights its update starts from; K >= 1 samples iteration ``i`` from the weights of
    iteration ``i - K`` in a background thread while iteration ``i - 1`` updates, so sampling
    and training overlap. The lag is always exactly K (a run depends on its seed and K, not
    on timing); the sampler's log-probs are kept, ``loss/mismatch_*`` measure the lag and
    ``algorithm.tis_cap`` corrects it. Token rollouts (the GRPO family), one process."""
    noise_layout: Literal["global", "local"] = "global"
    """``global``: each process draws the whole batch's noise and keeps its slice, so N processes
    reproduce a one-process run; ``local``: each draws only its own (cheaper at large scale)."""


@dataclass
class OptimConfig:
    lr: float = 3e-4
    """AdamW learning rate (Flow-GRPO: 3e-4 with LoRA)."""
    weight_decay: float = 1e-4
    """AdamW weight decay (Flow-GRPO: 1e-4)."""
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    """AdamW betas."""
    eps: float = 1e-8
    """AdamW epsilon."""
    max_grad_norm: float | None = 1.0
    """Clip the global gradient norm; None disables (Flow-GRPO: 1.0)."""
    lr_schedule: Literal["constant", "cosine", "linear"] = "constant"
    """Decay after warm-up, over all optimizer steps of the run."""
    warmup_steps: int = 0
    """Linear warm-up steps from 0 to ``lr``."""
    ema_decay: float | None = None
    """EMA of trainable weights used for evaluation; None disables (Flow-GRPO: 0.9)."""
    ema_every: int = 1
    """Update the EMA every this many optimizer steps (Flow-GRPO: 8)."""


@dataclass
class EvalConfig:
    every: int = 0
    """Evaluate every this many iterations (0: only before and after training)."""
    samples_per_prompt: int = 32
    """Held-out samples per prompt, from the rollout's deterministic (or fixed-seed) sampler
    (flow: ``sampler.eval_num_steps`` ODE steps; tokens: ``generation.eval_temperature``)."""
    seed: int = 1234
    """Seed of the held-out initial noise (flow) or sampling generator (tokens)."""
    batch_size: int = 256
    """Samples per sampling batch in evaluation (lower it for real models)."""


@dataclass
class LoggingConfig:
    log_every: int = 5
    """Print a one-line console summary every this many iterations."""
    tensorboard: bool = True
    """Write TensorBoard event files under ``<run>/tensorboard`` when ``report_to`` lists
    ``tensorboard`` (false turns it off either way)."""
    report_to: list[str] = field(default_factory=lambda: ["tensorboard"])
    """Experiment trackers, as TRL's ``report_to``: ``tensorboard``, ``wandb`` (files under
    ``<run>/wandb``; ``WANDB_MODE=offline`` needs no account) and ``trackio`` (a local SQLite
    database under ``<run>/trackio`` unless ``TRACKIO_DIR`` is set); ``[]`` for none. They get
    TRL's metric names where the quantity is the same (README, "Experiment trackers") and the
    sample grids of every evaluation that draws them."""
    project: str = "genrl"
    """Project name of the wandb and Trackio runs (each run is named after its directory)."""
    checkpoint_every: int = 0
    """Save a resumable checkpoint every this many iterations (0: only at the end)."""
    keep_checkpoints: int = 2
    """Keep this many most recent checkpoints."""
    progress_bar: bool = True
    """Show a progress bar over iterations."""
    grid_prompts: int = 10
    """Prompts in the before/after sample grids (4 samples each)."""
    plan: Literal["auto", "on", "off"] = "auto"
    """Plan the run's own setup (``genrl plan``'s row for its strategy, LoRA or full and
    checkpointing) into ``plan.json`` when it starts, and compare it with the measured peak
    memory in ``summary.json`` and ``report.html`` at its end. ``auto``: on CUDA, for a model
    the planner knows (a quiet note otherwise); ``on``: also on a CPU, and an error when the
    model cannot be planned; ``off``: never."""


@dataclass
class TrainConfig:
    recipe: str = "custom"
    """Name of the recipe this config came from (recorded in summary.json)."""
    seed: int = 0
    """Seed of every random stream in the run (prompts, noise, shuffling)."""
    output_dir: str | None = None
    """Run directory; None makes ``runs/<recipe>-<timestamp>``."""
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    sampler: FlowSamplingConfig | None = None
    """``sampler.*``: a flow rollout's settings, of the class its algorithm reads
    (``Algorithm.sections``: ``SDESamplingConfig`` for Flow-GRPO, ``StochasticSamplingConfig``
    for BranchGRPO, ``FlowSamplingConfig`` for RAM, GDRO and DiffusionNFT); None in token runs."""
    generation: TokenGenerationConfig | None = None
    """``generation.*``: a token rollout's settings (``GenerationConfig`` for the GRPO family,
    ``UnmaskingConfig`` for masked-diffusion LMs); None in flow runs."""
    reward: list[RewardSpec] = field(default_factory=lambda: [RewardSpec()])
    reward_aggregation: Literal["weighted_sum", "normalize_then_sum"] = "weighted_sum"
    """How several rewards become the one the algorithm sees: their weighted sum, or GDPO's
    per-reward group z-scores summed with the weights and normalised over the batch (pair it
    with ``algorithm.std_mode=none`` or ``global`` to keep GDPO's scale per group)."""
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    allocation: AllocationConfig = field(default_factory=AllocationConfig)
    """``allocation.*``: how an iteration spends its rollout budget over prompts
    (``genrl/allocation/``; default ``uniform``, ``train.group_size`` samples per prompt)."""
    prompts: PromptConfig = field(default_factory=PromptConfig)
    train: TrainLoopConfig = field(default_factory=TrainLoopConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    replay: ReplayConfig = field(default_factory=ReplayConfig)
    """``replay.*``: earlier completions mixed into the groups (ExGRPO, AR3PO's reuse;
    ``genrl/loop/replay.py``); off by default."""

    def __post_init__(self) -> None:
        self.fit_sections()

    def fit_sections(self) -> None:
        """Give the run exactly the rollout sections its algorithm reads
        (``Algorithm.sections``): a missing one gets its defaults, one of a related class (a
        switch from ``flow_grpo`` to ``ram``) keeps the fields the two share, and a section the
        algorithm does not read is dropped. An unregistered algorithm is left to ``validate``."""
        if self.algorithm.name not in ALGORITHMS:
            return
        needed = ALGORITHMS[self.algorithm.name].sections
        for name in ROLLOUT_SECTIONS:
            current, cls = getattr(self, name), needed.get(name)
            if cls is None or type(current) is cls:
                setattr(self, name, current if cls is not None else None)
                continue
            shared = {} if current is None else dataclasses.asdict(current)
            names = {f.name for f in dataclasses.fields(cls)}
            setattr(self, name, cls(**{k: v for k, v in shared.items() if k in names}))

    def set_algorithm(self, algorithm: AlgorithmConfig) -> TrainConfig:
        """Switch to ``algorithm`` (its config) and fit the rollout sections to it."""
        self.algorithm = algorithm
        self.fit_sections()
        return self

    def apply_overrides(self, assignments: list[str]) -> TrainConfig:
        """Apply ``key=value`` strings in order; returns self."""
        for text in assignments:
            key, value = parse_assignment(text)
            section = key.split(".", 1)[0]
            if key == "algorithm.name":
                # Switching algorithm replaces the whole section with that algorithm's defaults
                # and fits the rollout sections to it.
                self.set_algorithm(algorithm_config(value))
            elif section in ROLLOUT_SECTIONS and getattr(self, section) is None:
                raise ConfigError(self._missing_section(key, section))
            else:
                apply_override(self, key, value)
        return self

    def _missing_section(self, key: str, section: str) -> str:
        name = self.algorithm.name or "this run"
        reads = [f"{s}.*" for s in ROLLOUT_SECTIONS if getattr(self, s) is not None]
        hint = f"; its rollout reads {', '.join(reads)}" if reads else ""
        return f"{key}: {name} has no {section} section{hint}"

    def to_dict(self) -> dict:
        return to_dict(self)

    def validate(self, num_processes: int = 1) -> None:
        """Raise ``ConfigError`` for inconsistent settings."""
        check_finite(self)  # first: NaN passes every range check below
        t, o = self.train, self.optim
        positive = {
            "train.iterations": t.iterations,
            "train.prompts_per_iteration": t.prompts_per_iteration,
            "train.group_size": t.group_size,
            "train.inner_epochs": t.inner_epochs,
            "train.minibatch_size": t.minibatch_size,
            "train.gradient_accumulation_steps": t.gradient_accumulation_steps,
            "train.dynamic_sampling_max_rounds": t.dynamic_sampling_max_rounds,
            "eval.samples_per_prompt": self.eval.samples_per_prompt,
            "eval.batch_size": self.eval.batch_size,
            "optim.ema_every": o.ema_every,
            "logging.log_every": self.logging.log_every,
            "logging.keep_checkpoints": self.logging.keep_checkpoints,
        }
        for key, value in positive.items():
            if value < 1:  # e.g. keep_checkpoints=0 would delete the checkpoint just written
                raise ConfigError(f"{key} must be >= 1, got {value}")
        for key, value in {
            "train.rollout_batch_size": t.rollout_batch_size,
            "eval.every": self.eval.every,
            "optim.warmup_steps": o.warmup_steps,
            "logging.checkpoint_every": self.logging.checkpoint_every,
        }.items():
            if value < 0:
                raise ConfigError(f"{key} must be >= 0, got {value}")
        validate_sampling_modes(self, num_processes)
        validate_allocation(self, num_processes)
        if t.dynamic_sampling and t.prompts_per_iteration % num_processes:
            raise ConfigError(
                f"train.dynamic_sampling keeps whole groups on each process: "
                f"train.prompts_per_iteration ({t.prompts_per_iteration}) must be divisible by "
                f"the number of processes ({num_processes})"
            )
        if o.lr <= 0:
            raise ConfigError(f"optim.lr must be positive, got {o.lr}")
        if len(o.betas) != 2 or not all(0 <= b < 1 for b in o.betas):
            raise ConfigError(f"optim.betas must be two numbers in [0, 1), got {o.betas}")
        if o.ema_decay is not None and not 0 < o.ema_decay < 1:
            raise ConfigError(f"optim.ema_decay must lie in (0, 1), got {o.ema_decay}")
        if o.max_grad_norm is not None and o.max_grad_norm <= 0:
            raise ConfigError(
                f"optim.max_grad_norm must be positive or none, got {o.max_grad_norm}"
            )
        if self.policy.dtype != "float32" and t.mixed_precision == "no":
            raise ConfigError(
                f"policy.dtype={self.policy.dtype} needs train.mixed_precision=bf16 or fp16: "
                "float32 LoRA weights on low-precision base layers only mix under autocast"
            )
        if self.policy.lora_rank < 0:
            raise ConfigError(f"policy.lora_rank must be >= 0, got {self.policy.lora_rank}")
        if not self.reward:
            raise ConfigError("reward: at least one reward model is needed")
        if all(spec.weight == 0 for spec in self.reward):
            fields = ", ".join(f"reward.{i}.weight" for i in range(len(self.reward)))
            raise ConfigError(
                f"{fields}: every reward weight is 0, so the training reward is 0 for every "
                "sample and nothing is learned; give a reward a nonzero weight"
            )
        from genrl.reporting.trackers import check_report_to

        check_report_to(self.logging.report_to)
        if self.reward_aggregation not in ("weighted_sum", "normalize_then_sum"):
            raise ConfigError(
                "reward_aggregation must be weighted_sum or normalize_then_sum, "
                f"got {self.reward_aggregation!r}"
            )
        from pipelines import POLICIES
        from reward_models import REWARDS

        if self.policy.name not in POLICIES:
            raise ConfigError(
                unknown_message(self.policy.name, list(POLICIES), "policy.name", value=True)
            )
        for i, spec in enumerate(self.reward):
            if spec.name not in REWARDS:
                raise ConfigError(
                    unknown_message(spec.name, list(REWARDS), f"reward.{i}.name", value=True)
                )
        samples = t.prompts_per_iteration * t.group_size
        if samples % num_processes:
            raise ConfigError(
                f"train.prompts_per_iteration * train.group_size = {samples} samples per iteration "
                f"must divide evenly over {num_processes} processes"
            )
        if self.algorithm.name not in ALGORITHMS:
            raise ConfigError(
                unknown_message(self.algorithm.name, list(ALGORITHMS), "algorithm.name", value=True)
            )
        # A config may be group-free although its algorithm is not (GRPO's advantage=mssr).
        group_free = bool(getattr(self.algorithm, "group_free", False))
        if ALGORITHMS[self.algorithm.name].needs_groups and t.group_size < 2 and not group_free:
            raise ConfigError(
                f"train.group_size must be >= 2 for {self.algorithm.name}: its advantages compare "
                "the samples of a prompt's group, so a group of one has advantage 0 and nothing "
                "is learned"
            )
        self._validate_sections()
        self.algorithm.validate(self)
        group_units = getattr(ALGORITHMS[self.algorithm.name], "group_units", False)
        if group_units and t.prompts_per_iteration % num_processes:
            raise ConfigError(
                f"{self.algorithm.name} trains on whole groups, so each process needs whole ones: "
                f"train.prompts_per_iteration ({t.prompts_per_iteration}) must be divisible by "
                f"the number of processes ({num_processes})"
            )
        if t.offline_store or t.offline_groups:
            validate_offline(self, num_processes)

    def _validate_sections(self) -> None:
        """The rollout sections are the classes the algorithm reads, each valid."""
        name = self.algorithm.name
        needed = ALGORITHMS[name].sections
        for section in ROLLOUT_SECTIONS:
            value, cls = getattr(self, section), needed.get(section)
            if cls is None and value is not None:
                raise ConfigError(
                    f"{section}: {name} has no {section} section (set it to None, or switch "
                    "algorithms with --set algorithm.name / TrainConfig.set_algorithm)"
                )
            if cls is not None and type(value) is not cls:
                got = "none" if value is None else type(value).__name__
                raise ConfigError(
                    f"{section}: {name} reads it as {cls.__name__}, got {got} (switch "
                    "algorithms with --set algorithm.name / TrainConfig.set_algorithm)"
                )
            if value is not None:
                value.validate()


def algorithm_config(name: str) -> AlgorithmConfig:
    """Default config of the registered algorithm ``name``."""
    if name not in ALGORITHMS:
        raise ConfigError(unknown_message(name, list(ALGORITHMS), "algorithm.name", value=True))
    return ALGORITHMS[name].Config(name=name)
