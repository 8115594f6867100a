"""A one-call entry shaped like TRL's ``GRPOTrainer`` (docs/coming_from_trl.md).

``GRPOTrainer(model=..., reward_funcs=[...], args=..., train_dataset=...)`` builds the same
``TrainConfig`` that ``genrl train RECIPE --set ...`` builds (a recipe, then dotted overrides)
and trains it with the one ``genrl.Trainer``; there is no second loop. What the config cannot
name (Python functions, in-memory datasets) is registered under a name first, so the config
stays the plain, printable record of the run (``config.json``).
"""

from __future__ import annotations

import itertools
import json
import numbers
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from genrl.config.errors import ConfigError
from genrl.run.config import RewardSpec, TrainConfig, algorithm_config

RewardFunc = Callable[..., Sequence[float | None]]

# TRL GRPOConfig argument -> genrl's dotted key, for the settings that mean the same thing.
TRL_ARGS: dict[str, str] = {
    "learning_rate": "optim.lr",
    "weight_decay": "optim.weight_decay",
    "max_grad_norm": "optim.max_grad_norm",
    "lr_scheduler_type": "optim.lr_schedule",
    "warmup_steps": "optim.warmup_steps",
    "num_generations": "train.group_size",
    "num_iterations": "train.inner_epochs",
    "max_steps": "train.iterations",
    "max_completion_length": "generation.max_new_tokens",
    "temperature": "generation.temperature",
    "top_p": "generation.top_p",
    "beta": "algorithm.kl_beta",
    "epsilon": "algorithm.clip_range",
    "epsilon_high": "algorithm.clip_range_high",
    "seed": "seed",
    "output_dir": "output_dir",
    "report_to": "logging.report_to",
    "logging_steps": "logging.log_every",
    "save_steps": "logging.checkpoint_every",
}

# Policy name -> the recipe whose settings a run of that kind of policy starts from.
BASE_RECIPES: dict[str, str] = {
    "countdown_lm": "llm_countdown_grpo",
    "causal_lm": "qwen3_countdown_grpo",  # TRL's GRPOConfig defaults, LoRA, bf16 (a GPU job)
    "sudoku_dllm": "dllm_sudoku_maskgrpo",
    "masked_lm": "dllm_sudoku_maskgrpo",
    "shapes_vlm": "vlm_shapes_grpo",
    "vlm": "vlm_shapes_grpo",
    "toy_digits": "digits_flow_grpo",
    "toy_video_digits": "video_digits_flow_grpo",
    "toy_compositional": "compositional_flow_grpo",
    "compositional_discrete": "compositional_discrete_maskgrpo",
}
FLOW_BASE = "sd35m_pickscore"
"""Base recipe of a diffusers checkpoint (Flow-GRPO's SD3.5 settings)."""

_counter = itertools.count()


def policy_for(model: str) -> tuple[str, str | None]:
    """``(policy.name, policy.pretrained)`` of ``model``: a registered embedded policy, a local
    diffusers folder (``model_index.json``: ``flow_image``), a local transformers folder with a
    vision config (``vlm``) or any other transformers folder or hub id (``causal_lm``). A hub id
    whose ``model_index.json`` is in the local cache is a diffusers model."""
    from pipelines import POLICIES

    if not isinstance(model, str):
        raise ConfigError(
            "model: expected a registered policy's name (countdown_lm, toy_digits, ...), a "
            f"local model folder or a hub id, got {_shown(model)}"
        )
    if model in POLICIES:
        return model, None
    folder = Path(model)
    if folder.is_dir():
        if (folder / "model_index.json").is_file():
            return "flow_image", model
        config = folder / "config.json"
        if config.is_file() and "vision_config" in json.loads(config.read_text(encoding="utf-8")):
            return "vlm", model
        return "causal_lm", model
    try:
        from huggingface_hub import try_to_load_from_cache

        if isinstance(try_to_load_from_cache(model, "model_index.json"), str):
            return "flow_image", model
    except Exception:  # a malformed id: transformers names it when loading
        pass
    return "causal_lm", model


def overrides_from_args(args: Mapping[str, Any] | Sequence[str] | None) -> list[str]:
    """``key=value`` strings from ``args``: ``["train.iterations=2"]`` as they are, or a mapping
    whose keys are dotted genrl keys or TRL ``GRPOConfig`` names (``TRL_ARGS``)."""
    if args is None:
        return []
    if isinstance(args, str) or not isinstance(args, Mapping | Sequence):
        raise ConfigError(
            "args: expected a mapping such as {'max_steps': 20} or a list of key=value "
            f"strings, got {_shown(args)}"
        )
    if not isinstance(args, Mapping):
        for i, text in enumerate(args):
            if not isinstance(text, str):
                raise ConfigError(f"args.{i}: expected a key=value string, got {_shown(text)}")
        return list(args)
    out = []
    for key, value in args.items():
        if not isinstance(key, str):
            raise ConfigError(f"args: keys are setting names (strings), got {_shown(key)}")
        if "." not in key and key in TRL_ARGS:
            if key == "report_to" and isinstance(value, str):
                value = [] if value == "none" else [value]
            key = TRL_ARGS[key]
        elif "." not in key and key not in ("seed", "output_dir", "recipe", "reward_aggregation"):
            raise ConfigError(
                f"args.{key}: not a TRL GRPOConfig argument genrl maps ({', '.join(TRL_ARGS)}) "
                "nor a dotted genrl key such as train.iterations"
            )
        out.append(f"{key}={_text(value)}")
    return out


def _text(value: Any) -> str:
    """A Python value as the text ``--set`` takes (JSON for lists, dicts, booleans, None)."""
    return value if isinstance(value, str) else json.dumps(value)


def _shown(value: Any) -> str:
    """``5 (an int)``: a wrong argument and its type, for messages."""
    if value is None:
        return "None"
    text = repr(value)
    text = text if len(text) <= 40 else text[:37] + "..."
    kind = type(value).__name__
    return f"{text} ({'an' if kind[:1] in 'aeiou' else 'a'} {kind})"


def reward_specs(
    reward_funcs: RewardFunc | str | Sequence[RewardFunc | str],
    weights: Sequence[float] | None = None,
) -> list[RewardSpec]:
    """A ``RewardSpec`` per reward: a registered reward's name as it is; a Python function
    ``fn(prompts, completions, **columns) -> list[float | None]`` registered under its
    ``__name__`` (TRL names its ``rewards/<name>/mean`` metric the same way)."""
    from reward_models import REWARDS, CallableReward

    if callable(reward_funcs) or isinstance(reward_funcs, str):
        funcs: list[Any] = [reward_funcs]
    elif isinstance(reward_funcs, Sequence):
        funcs = list(reward_funcs)
    else:
        raise ConfigError(
            "reward_funcs: expected a reward function, a registered reward's name or a list "
            f"of them, got {_shown(reward_funcs)}"
        )
    if not funcs:
        raise ConfigError("reward_funcs: at least one reward function or reward name is needed")
    if weights is not None:
        weights = _weights(weights, len(funcs))
    specs = []
    for i, fn in enumerate(funcs):
        weight = 1.0 if weights is None else weights[i]
        if isinstance(fn, str):
            if fn not in REWARDS:
                from genrl.config.errors import unknown_message

                raise ConfigError(
                    unknown_message(fn, list(REWARDS), f"reward_funcs.{i}", value=True)
                )
            specs.append(RewardSpec(name=fn, weight=weight))
            continue
        if not callable(fn):
            raise ConfigError(f"reward_funcs.{i}: expected a function or a reward name, got {fn!r}")
        name = getattr(fn, "__name__", "") or f"reward_func_{i}"
        name = f"reward_func_{i}" if name == "<lambda>" else name
        # A function registered by an earlier call may be replaced; a registered reward not.
        if name in REWARDS and not hasattr(REWARDS[name], "reward_function"):
            raise ConfigError(
                f"reward_funcs.{i}: {name!r} is the name of a registered reward; rename the "
                "function (its name becomes the reward's)"
            )

        def factory(fn: RewardFunc = fn, name: str = name) -> CallableReward:
            return CallableReward(fn, name=name)

        factory.reward_function = fn  # type: ignore[attr-defined]
        REWARDS[name] = factory
        specs.append(RewardSpec(name=name, weight=weight))
    return specs


def _weights(weights: Any, count: int) -> list[float]:
    """``reward_weights`` as floats, one per reward function; anything else is refused by
    name (a string or a boolean is not a weight)."""
    if isinstance(weights, str) or not isinstance(weights, Sequence):
        raise ConfigError(
            f"reward_weights: expected a list of numbers, one per reward function, got "
            f"{_shown(weights)}"
        )
    if len(weights) != count:
        raise ConfigError(f"reward_weights: {len(weights)} weights for {count} reward functions")
    for i, weight in enumerate(weights):
        if isinstance(weight, bool) or not isinstance(weight, numbers.Real):
            raise ConfigError(f"reward_weights.{i}: expected a number, got {_shown(weight)}")
    return [float(weight) for weight in weights]


def register_prompts(dataset: Any, role: str, column: str) -> str:
    """The ``prompts.dataset`` value of ``dataset``: a string (a registered set, a file, an
    ``hf:`` spec) as it is; a ``datasets.Dataset``, a list of strings or a list of row dicts
    registered as a prompt set of its own."""
    from genrl.prompts.datasets import from_dataset
    from genrl.prompts.sources import NO_HELDOUT, PromptSource, register_prompt_set

    if isinstance(dataset, str | Path):
        return str(dataset)
    if not hasattr(dataset, "column_names") and (
        isinstance(dataset, Mapping) or not isinstance(dataset, Iterable)
    ):
        raise ConfigError(
            f"{role}: expected a datasets.Dataset, a list of prompts or row dicts, or a file "
            f"or prompt set name, got {_shown(dataset)}"
        )
    rows = list(dataset) if not hasattr(dataset, "column_names") else dataset
    if isinstance(rows, list) and rows and all(isinstance(r, str) for r in rows):
        rows = [{column: r} for r in rows]
    prompts = from_dataset(rows, role, column)
    name = f"api_{role}_{next(_counter)}"
    register_prompt_set(
        name, lambda: PromptSource(list(prompts), list(prompts), heldout=NO_HELDOUT)
    )
    return name


def build_config(
    model: str | os.PathLike[str],
    reward_funcs: RewardFunc | str | Sequence[RewardFunc | str],
    args: Mapping[str, Any] | Sequence[str] | None = None,
    train_dataset: Any = None,
    eval_dataset: Any = None,
    *,
    algorithm: str | None = None,
    reward_weights: Sequence[float] | None = None,
    recipe: str | None = None,
) -> TrainConfig:
    """The ``TrainConfig`` of a ``GRPOTrainer`` call, validated: the base recipe of the model's
    kind (or ``recipe``), its policy, algorithm, rewards and prompts replaced, then ``args``
    applied as ``--set`` overrides are."""
    from genrl.recipes import get_recipe

    for argument, value in (("algorithm", algorithm), ("recipe", recipe)):
        if value is not None and not isinstance(value, str):
            raise ConfigError(f"{argument}: expected a name (a string), got {_shown(value)}")
    model = os.fspath(model) if isinstance(model, os.PathLike) else model
    name, pretrained = policy_for(model)
    config = get_recipe(recipe or BASE_RECIPES.get(name, FLOW_BASE))
    config.recipe = f"{recipe or config.recipe}_api"
    if model in (config.policy.name, config.policy.pretrained):
        pass  # the recipe's own model (e.g. sd35m_pickscore's hub id): its policy as it is
    elif config.policy.name != name or config.policy.pretrained != pretrained:
        keep = config.policy.name == name
        config.policy.name, config.policy.pretrained = name, pretrained
        if not keep:
            config.policy.kwargs = {}
    if algorithm is not None and algorithm != config.algorithm.name:
        config.set_algorithm(algorithm_config(algorithm))
    if isinstance(args, Mapping) and "reward_weights" in args:  # TRL keeps them in its config
        if reward_weights is not None:
            raise ConfigError("reward_weights: given both as an argument and in args")
        args = dict(args)
        reward_weights = args.pop("reward_weights")
    config.reward = reward_specs(reward_funcs, reward_weights)
    column = config.prompts.column
    overrides = overrides_from_args(args)
    for text in overrides:  # the column must be known before the datasets are read
        if text.startswith("prompts.column="):
            column = text.partition("=")[2]
    if train_dataset is not None:
        config.prompts.dataset = register_prompts(train_dataset, "train_dataset", column)
        config.prompts.eval_dataset = None
    if eval_dataset is not None:
        config.prompts.eval_dataset = register_prompts(eval_dataset, "eval_dataset", column)
    config.apply_overrides(overrides)
    config.validate()
    return config


class GRPOTrainer:
    """TRL's ``GRPOTrainer`` call on genrl's trainer.

    Args:
        model: a registered policy (``countdown_lm``, ``toy_digits``, ...), a local diffusers or
            transformers folder, or a hub id (``policy_for``).
        reward_funcs: a function ``fn(prompts, completions, **columns) -> list[float | None]``,
            a registered reward's name, or a list of them.
        args: dotted overrides (``{"train.iterations": 20}`` or ``["train.iterations=20"]``);
            TRL ``GRPOConfig`` names (``learning_rate``, ``num_generations``, ``beta``, ...)
            are translated (``TRL_ARGS``).
        train_dataset: a ``datasets.Dataset``, a list of prompts or row dicts, or what
            ``prompts.dataset`` takes (a file, ``hf:NAME``); its other columns reach the
            reward functions as keyword arguments. None keeps the base recipe's prompts.
        eval_dataset: held-out prompts, the same kinds; None evaluates on ``train_dataset``.
        algorithm: a registered algorithm (``grpo``, ``flow_grpo``, ``ram``, ...); None keeps
            the base recipe's.
        reward_weights: one weight per reward (TRL's ``reward_weights``).
        recipe: the recipe to start from instead of the one of the model's kind.
        overwrite: let the run replace another run in its directory.
    """

    def __init__(
        self,
        model: str | os.PathLike[str],
        reward_funcs: RewardFunc | str | Sequence[RewardFunc | str],
        args: Mapping[str, Any] | Sequence[str] | None = None,
        train_dataset: Any = None,
        eval_dataset: Any = None,
        *,
        algorithm: str | None = None,
        reward_weights: Sequence[float] | None = None,
        recipe: str | None = None,
        overwrite: bool = False,
    ) -> None:
        self.config = build_config(
            model,
            reward_funcs,
            args,
            train_dataset,
            eval_dataset,
            algorithm=algorithm,
            reward_weights=reward_weights,
            recipe=recipe,
        )
        self.overwrite = overwrite
        self.trainer: Any = None

    def train(self) -> dict[str, Any]:
        """Train (the models load here); returns the run's ``summary.json`` contents."""
        from genrl.loop.trainer import Trainer

        if self.trainer is None:
            self.trainer = Trainer(self.config, overwrite=self.overwrite)
        return self.trainer.train()


__all__ = ["BASE_RECIPES", "TRL_ARGS", "GRPOTrainer", "build_config", "policy_for"]
