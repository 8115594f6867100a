"""The rollouts' config sections, without torch: ``sampler.*`` of the flow rollouts and
``generation.*`` of the token rollouts, with the lagged copy's and the tree's fields that the
algorithms' configs inherit.

They live apart from the rollouts (``flow.py``, ``flow_sde.py``, ``endpoints.py``, ``tree.py``,
``tokens.py``, ``masked.py``, which import them) so that the command line builds and checks a
whole config before it imports torch: a mistyped key or value answers in well under a second.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from genrl.config.errors import ConfigError, unknown_message
from genrl.rollouts.engines import check_engine
from samplers.catalog import SAMPLER_CATALOG
from samplers.masked_schedule import unmasking_schedule
from samplers.tree_schedule import TreeSchedule


@dataclass
class FlowSamplingConfig:
    """``sampler.*``: the noise schedule, guidance and step counts of a flow rollout."""

    num_steps: int = 10
    """Sampling steps in rollouts (Flow-GRPO: 10)."""
    shift: float | None = None
    """SD3 time shift of a linear sigma schedule; None uses the model's own scheduler exactly as
    its diffusers pipeline does (the embedded model: linear, shift 1)."""
    guidance_scale: float = 1.0
    """Classifier-free guidance in rollouts and training; 1 disables CFG (single forward)."""
    eval_num_steps: int = 10
    """Deterministic ODE steps of held-out evaluation (Flow-GRPO evaluates real models with
    40)."""

    def validate(self) -> None:
        """Raise ``ConfigError`` naming the field."""
        for key in ("num_steps", "eval_num_steps"):
            if getattr(self, key) < 1:
                raise ConfigError(f"sampler.{key} must be >= 1, got {getattr(self, key)}")
        if self.shift is not None and self.shift <= 0:
            raise ConfigError(f"sampler.shift must be positive or none, got {self.shift}")
        if self.guidance_scale < 1:
            raise ConfigError(
                f"sampler.guidance_scale must be >= 1 (1 = no CFG), got {self.guidance_scale}"
            )


@dataclass
class StochasticSamplingConfig(FlowSamplingConfig):
    """``sampler.*`` of rollouts made of stochastic steps with log-probs."""

    name: str = "flow_sde"
    """Stochastic sampler (registry ``samplers.SAMPLERS``, names in
    ``samplers.catalog``): ``flow_sde`` (Flow-GRPO),
    ``flow_sde_linear`` (Flow-GRPO's Wan variant, diffusion linear in the noise level),
    ``dance_sde`` (DanceGRPO, constant diffusion) or ``flow_cps`` (coefficients-preserving)."""
    noise_level: float = 0.7
    """Noise of the stochastic sampler: ``a`` in Flow-GRPO's ``sigma_s = a*sqrt(s/(1-s))``
    (0.7), the factor on ``flow_sde_linear``'s ``sigma_s ~ s`` (1.0), DanceGRPO's constant
    ``eta`` (0.3), or CPS's ``a`` in ``std = s_next*sin(a*pi/2)``."""
    log_prob_reduction: Literal["mean", "sum"] = "mean"
    """Reduce per-element log-probs by mean (Flow-GRPO; clip ranges ~1e-4) or sum."""

    def validate(self) -> None:
        super().validate()
        if self.name not in SAMPLER_CATALOG:
            raise ConfigError(
                unknown_message(self.name, list(SAMPLER_CATALOG), "sampler.name", value=True)
            )
        entry = SAMPLER_CATALOG[self.name]
        low, high = entry.noise_level_range
        if not low <= self.noise_level <= high:
            raise ConfigError(
                f"sampler.noise_level must lie in [{low}, {high}] for {self.name}, "
                f"got {self.noise_level}"
            )
        if not entry.stochastic:
            stochastic = [n for n, e in SAMPLER_CATALOG.items() if e.stochastic]
            raise ConfigError(
                f"sampler.name={self.name!r} is deterministic; rollouts need a stochastic "
                f"sampler ({', '.join(stochastic)})"
            )


@dataclass
class SDESamplingConfig(StochasticSamplingConfig):
    """``sampler.*`` of trajectories with a window of stochastic steps (Flow-GRPO, -Fast,
    MixGRPO; DanceGRPO and CPS through ``name``)."""

    sde_window_size: int = 0
    """Stochastic steps per trajectory; 0 makes every step stochastic (Flow-GRPO). With ``k > 0``
    only a window of ``k`` consecutive steps is stochastic (and trained); the others are ODE
    steps (Flow-GRPO-Fast: 2-3; MixGRPO: 4)."""
    sde_window_schedule: Literal["random", "progressive", "decay"] = "random"
    """Where the window sits: ``random`` draws its start each iteration from
    ``sde_window_range`` (Flow-GRPO-Fast, MixGRPO-random); ``progressive`` slides it from the
    first step towards the last by ``sde_window_stride`` every ``sde_window_shift_every``
    iterations (MixGRPO); ``decay`` slides it likewise with an interval that shrinks linearly in
    the window's position from ``sde_window_shift_every`` to ``sde_window_shift_every_min``
    (MixGRPO's ``decay``; its defaults 10 and 1)."""
    sde_window_range: list[int] | None = None
    """``[first, last)``: the steps a random window lies within (Flow-GRPO-Fast:
    ``[0, num_steps // 2]``); None allows every position."""
    sde_window_stride: int = 1
    """Steps the progressive window advances per shift."""
    sde_window_shift_every: int = 25
    """Iterations between shifts of the progressive window (the first interval of ``decay``)."""
    sde_window_shift_every_min: int = 1
    """Last interval of the ``decay`` schedule."""
    sde_window_wrap: bool = False
    """A sliding window that has passed the last step starts again at step 0 (MixGRPO's
    ``--roll_back``, used by its released scripts); otherwise it stays at the end."""
    same_initial_noise: bool = False
    """Every sample of a group starts from the same noise. With a window that starts after
    step 0 the ODE prefix is then identical within a group and computed once per prompt
    (Flow-GRPO-Fast's branching)."""

    def validate(self) -> None:
        super().validate()
        if self.sde_window_size < 0 or self.sde_window_size > self.num_steps:
            raise ConfigError(
                f"sampler.sde_window_size must lie in [0, sampler.num_steps={self.num_steps}], "
                f"got {self.sde_window_size}"
            )
        intervals = (self.sde_window_stride, self.sde_window_shift_every,
                     self.sde_window_shift_every_min)  # fmt: skip
        if min(intervals) < 1:
            raise ConfigError(
                "sampler.sde_window_stride, sde_window_shift_every and sde_window_shift_every_min "
                "must be >= 1"
            )
        if self.sde_window_range is None:
            return
        if self.sde_window_size == 0 or self.sde_window_schedule != "random":
            raise ConfigError(
                "sampler.sde_window_range applies to a random window only: set "
                "sampler.sde_window_size > 0 and sde_window_schedule=random, or drop the range"
            )
        r, k, n = self.sde_window_range, self.sde_window_size, self.num_steps
        if len(r) != 2 or not (r[0] >= 0 and r[0] + k <= r[1] <= n):
            raise ConfigError(
                f"sampler.sde_window_range must be [first, last) steps that hold the "
                f"{k}-step window within {n} steps (0 <= first, first + {k} <= last <= {n}), "
                f"got {r}"
            )


@dataclass
class DDIMSamplingConfig(FlowSamplingConfig):
    """``sampler.*`` of DDIM trajectories of an epsilon / v-prediction diffusion model (DDPO;
    Flow-GRPO's objective on them, ``ddim_grpo``), on the model's own scheduler timesteps.
    Defaults are DDPO's ``config/base.py``."""

    num_steps: int = 50
    """DDIM steps in rollouts (DDPO: 50)."""
    guidance_scale: float = 5.0
    """Classifier-free guidance in rollouts and training (DDPO: 5.0; 1 disables CFG)."""
    eval_num_steps: int = 50
    """Deterministic DDIM steps (eta = 0) of held-out evaluation."""
    noise_level: float = 1.0
    """DDIM's ``eta`` (Song et al. 2021, eq. 16): 1 is DDPM's posterior noise (DDPO), 0
    deterministic DDIM, which has no log-prob to train."""
    log_prob_reduction: Literal["mean", "sum"] = "mean"
    """Reduce per-element log-probs by mean (DDPO; clip range 1e-4) or sum."""

    def validate(self) -> None:
        super().validate()
        if self.shift is not None:
            raise ConfigError(
                "sampler.shift is a flow model's time shift; a DDIM rollout runs on the "
                "model's own scheduler timesteps: leave sampler.shift unset"
            )
        if not self.noise_level >= 0:
            raise ConfigError(
                f"sampler.noise_level (DDIM's eta) must be >= 0, got {self.noise_level}"
            )


@dataclass
class LaggedCopyConfig:
    """Fields of the lagged copy that samples the endpoints (RAM, DiffusionNFT)."""

    sampling_ema_decay: float = 0.0
    """``old <- d old + (1 - d) theta`` before each iteration's sampling, with
    ``d = min(sampling_ema_ramp * iteration, sampling_ema_decay)`` (0: the copy is the policy as
    it was before the iteration's updates)."""
    sampling_ema_ramp: float = 0.0
    """Per-iteration growth of the lagged copy's decay (0: constant ``sampling_ema_decay``)."""
    sampling_ema_delay: int = 0
    """Iterations with decay 0 before the ramp starts (DiffusionNFT's OCR setting: 75)."""

    def validate_lagged_copy(self) -> None:
        if not 0 <= self.sampling_ema_decay < 1:
            raise ConfigError(
                f"algorithm.sampling_ema_decay must lie in [0, 1), got {self.sampling_ema_decay}"
            )
        if self.sampling_ema_ramp < 0 or self.sampling_ema_delay < 0:
            raise ConfigError("algorithm.sampling_ema_ramp and sampling_ema_delay must be >= 0")

    def lagged_decay(self, iteration: int) -> float:
        """The lagged copy's decay at ``iteration``."""
        if iteration < self.sampling_ema_delay:
            return 0.0
        if self.sampling_ema_ramp == 0:
            return self.sampling_ema_decay
        ramped = self.sampling_ema_ramp * (iteration - self.sampling_ema_delay)
        return min(ramped, self.sampling_ema_decay)


@dataclass
class BranchingRolloutConfig:
    """Fields of the tree rollout (BranchGRPO documents its defaults)."""

    split_steps: list[int] = field(default_factory=lambda: [0, 2, 4, 6])
    """Steps at which every node splits (the reference's ``--tree_split_points``)."""
    branching: list[int] = field(default_factory=lambda: [2, 2, 2, 2])
    """Children per node at each split (the reference always splits in 2); their product must
    equal ``train.group_size``."""
    split_noise_scale: float = 1.0
    """Multiplier of the noise of the split steps, drift unchanged (the reference's
    ``--tree_split_noise_scale``; its FLUX script uses 4)."""
    split_log_prob: Literal["base", "drawn"] = "base"
    """Density split edges are scored under: the base step's (the reference) or the one they
    were drawn from, with the noise scaled."""
    split_noise_level: float | None = None
    """Instead of scaling the noise, run the split steps with a sampler of this noise level (its
    own drift and density); None keeps the reference's scaled noise."""
    ode_steps: list[int] = field(default_factory=list)
    """Deterministic steps (BranchGRPO-Mix: ODE outside the branching region); never trained."""
    max_batch: int = 0
    """Nodes per model forward in the rollout (0: all live nodes of a step at once)."""

    def schedule(self, num_steps: int) -> TreeSchedule:
        return TreeSchedule(num_steps, tuple(self.split_steps), tuple(self.branching),
                            tuple(self.ode_steps))  # fmt: skip

    def validate_rollout(self, train_config: Any = None) -> None:
        """Raise ``ConfigError`` naming the field that cannot work."""
        if not self.split_noise_scale > 0:
            raise ConfigError(
                f"algorithm.split_noise_scale must be > 0, got {self.split_noise_scale}"
            )
        if self.split_noise_level is not None and self.split_noise_scale != 1:
            raise ConfigError(
                "algorithm.split_noise_level and split_noise_scale are two ways to widen the "
                "splits: set one of them"
            )
        if self.max_batch < 0:
            raise ConfigError(f"algorithm.max_batch must be >= 0, got {self.max_batch}")
        if train_config is None:
            return
        t, s = train_config.train, train_config.sampler
        try:
            schedule = self.schedule(s.num_steps)
        except ValueError as err:
            raise ConfigError(f"algorithm: {err}") from None
        if t.group_size != schedule.num_leaves:
            raise ConfigError(
                f"train.group_size ({t.group_size}) must equal the tree's leaves "
                f"(prod of algorithm.branching = {schedule.num_leaves})"
            )
        if t.dynamic_sampling:
            raise ConfigError(
                "branch_grpo trains whole trees: train.dynamic_sampling is not supported"
            )


@dataclass
class TokenGenerationConfig:
    """``generation.*`` of every token rollout."""

    max_new_tokens: int = 64
    """Completion length limit in tokens (TRL: ``max_completion_length``); a masked-diffusion
    LM's fixed completion length."""
    temperature: float = 1.0
    """Sampling temperature of token rollouts; log-probs are scored at the same temperature."""
    eval_temperature: float = 0.0
    """Temperature of held-out evaluation; 0 decodes greedily (one sample per prompt suffices)."""

    def validate(self) -> None:
        """Raise ``ConfigError`` naming the field."""
        if self.max_new_tokens < 1:
            raise ConfigError(f"generation.max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.temperature < 0 or self.eval_temperature < 0:
            raise ConfigError("generation.temperature and eval_temperature must be >= 0")


@dataclass
class GenerationConfig(TokenGenerationConfig):
    """``generation.*`` of autoregressive rollouts."""

    top_k: int = 0
    """Sample among the ``k`` most likely tokens (0 = all)."""
    top_p: float = 1.0
    """Nucleus sampling mass (1 = all); top-k/top-p restrict sampling but not the scored density."""
    stop_strings: list[str] = field(default_factory=list)
    """Cut a completion after the first of these strings; later tokens are not trained."""
    engine: str = "loop"
    """What samples the training rollouts (``genrl/rollouts/engines``): ``loop``, the built-in
    sampling loop over the policy's forward (exact, no second copy of the weights); ``vllm``, a
    colocated ``vllm.LLM`` on the policy's checkpoint (causal LMs; needs vLLM installed, see
    docs/algorithms/grpo.md), whose weights follow the trainer's after every update;
    ``vllm_server``, the same engine in its own process (``genrl serve-rollout``) at
    ``engine_url``, to which the weights are pushed over HTTP (the trainer needs no vLLM).
    Held-out evaluation samples with the loop either way."""
    engine_url: str = "http://127.0.0.1:8100"
    """``engine=vllm_server``: where ``genrl serve-rollout`` listens."""
    engine_token_env: str = "GENRL_ROLLOUT_TOKEN"
    """``engine=vllm_server``: the environment variable holding the server's token (sent as
    ``Authorization: Bearer``; none when unset)."""
    engine_timeout_s: float = 600.0
    """``engine=vllm_server``: seconds to wait for one reply (a batch's generation)."""
    engine_max_model_len: int = 0
    """``engine=vllm``: the longest prompt plus completion the engine serves, in tokens (vLLM's
    ``max_model_len``; at most the config's ``max_position_embeddings``); 0 takes that."""
    engine_kv_cache_mb: int = 256
    """``engine=vllm``: memory for the engine's key-value cache in MiB (vLLM's
    ``kv_cache_memory_bytes``), on the CPU or the accelerator; bounds how many sequences it
    runs at once."""
    engine_eager: bool = True
    """``engine=vllm``: run the model eagerly (no CUDA graphs or compilation): starts in seconds;
    set false on an accelerator for throughput."""

    def validate(self) -> None:
        super().validate()
        if self.top_k < 0 or not 0 < self.top_p <= 1:
            raise ConfigError(
                f"generation.top_k must be >= 0 and top_p in (0, 1], got {self.top_k}, {self.top_p}"
            )
        check_engine(self.engine)
        if not self.engine_timeout_s > 0:
            raise ConfigError(
                f"generation.engine_timeout_s must be > 0, got {self.engine_timeout_s}"
            )
        if self.engine == "vllm_server" and not self.engine_url.startswith(("http://", "https://")):
            raise ConfigError(
                f"generation.engine_url must be an http:// or https:// URL, got {self.engine_url!r}"
            )
        if self.engine_max_model_len < 0 or self.engine_kv_cache_mb < 1:
            raise ConfigError(
                "generation.engine_max_model_len must be >= 0 and engine_kv_cache_mb >= 1, got "
                f"{self.engine_max_model_len}, {self.engine_kv_cache_mb}"
            )


@dataclass
class UnmaskingConfig(TokenGenerationConfig):
    """``generation.*`` of masked-diffusion rollouts (``max_new_tokens`` is the fixed
    completion length)."""

    sampler: Literal["llada", "maskgit", "emerge"] = "llada"
    """How a completion is revealed: ``llada``, LLaDA's text sampler (``remasking``,
    ``block_length``; ``samplers/masked.py``); for masked image-token models
    (``samplers/masked_image.py``) ``maskgit``, aMUSEd's own scheduler (the stock pipeline's
    samples), or ``emerge``, MaskGRPO's emerge sampler (each masked token revealed
    independently with the schedule's probability, drawn at ``temperature``)."""
    diffusion_steps: int = 0
    """Unmasking steps over the completion (0 = one token per step; image samplers need
    1 to ``max_new_tokens``, aMUSEd's default 12)."""
    block_length: int | None = None
    """Semi-autoregressive block size (None = one block; ``llada`` only)."""
    remasking: Literal["low_confidence", "random"] = "low_confidence"
    """``llada``: reveal the most confident predictions or random positions."""
    final_temperature: float = 0.0
    """``maskgit``: the Gumbel temperature of the confidence falls linearly from
    ``temperature`` to this over the steps (the stock pipeline's ``temperature=(2, 0)``:
    ``temperature=2``, ``final_temperature=0``)."""
    masking_schedule: Literal["cosine", "linear"] | None = None
    """``maskgit``, ``emerge``: the mask-rate schedule ``gamma``; None takes the checkpoint's
    ``scheduler.config.masking_schedule`` (aMUSEd: cosine)."""

    def validate(self) -> None:
        super().validate()
        if self.final_temperature < 0:
            raise ConfigError("generation.final_temperature must be >= 0")
        if self.sampler != "llada":
            if self.block_length is not None:
                raise ConfigError(
                    f"generation.block_length: the {self.sampler} sampler reveals the whole "
                    "image at once; leave block_length null"
                )
            if not 1 <= self.diffusion_steps <= self.max_new_tokens:
                raise ConfigError(
                    f"generation.diffusion_steps must lie in [1, {self.max_new_tokens}] for the "
                    f"{self.sampler} sampler, got {self.diffusion_steps}"
                )
            return
        steps = self.diffusion_steps or self.max_new_tokens
        try:
            unmasking_schedule(steps, self.block_length, self.max_new_tokens)
        except ValueError as err:
            raise ConfigError(f"generation: {err}") from None
