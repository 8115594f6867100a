"""The TRL-shaped entry (``genrl.GRPOTrainer``): the config it builds and a short training run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from genrl import GRPOTrainer
from genrl.api import build_config, overrides_from_args, policy_for
from genrl.config.errors import ConfigError
from genrl.prompts.datasets import PromptFileError
from reward_models import REWARDS
from tasks.countdown import make_problems

datasets = pytest.importorskip("datasets")

TINY = {
    "max_steps": 2,
    "num_generations": 4,
    "train.prompts_per_iteration": 4,
    "eval.samples_per_prompt": 1,
    "logging.progress_bar": False,
}


def exact_target(completions, target, **kwargs):  # type: ignore[no-untyped-def]
    """1 when the completion is an expression (digits, + - * / and brackets only) whose value
    is the row's ``target`` column, else 0: a plain function in TRL's shape (keywords only,
    no ``prompts`` parameter) reading an extra column."""
    assert "numbers" in kwargs and "prompts" in kwargs  # the other columns arrive too
    scores = []
    for text, goal in zip(completions, target, strict=True):
        text = text.strip()
        ok = bool(text) and set(text) <= set("0123456789+-*/() ")
        try:
            value = eval(text, {"__builtins__": {}}) if ok else None
        except (SyntaxError, ZeroDivisionError):
            value = None
        scores.append(1.0 if value == goal else 0.0)
    return scores


def countdown_dataset(n: int) -> datasets.Dataset:
    problems = make_problems(n, 0, "train")
    return datasets.Dataset.from_list(
        [{"prompt": p.prompt, "target": p.target, "numbers": list(p.numbers)} for p in problems]
    )


def test_grpo_trainer_trains_countdown_from_a_dataset_with_a_plain_function(
    tmp_path: Path,
) -> None:
    torch.set_num_threads(1)
    trainer = GRPOTrainer(
        model="countdown_lm",
        reward_funcs=[exact_target],
        args={**TINY, "output_dir": str(tmp_path / "run"), "report_to": "none"},
        train_dataset=countdown_dataset(8),
    )
    config = trainer.config
    # The same config the CLI would build: llm_countdown_grpo with the overrides applied.
    assert config.policy.name == "countdown_lm" and config.algorithm.name == "grpo"
    assert config.train.iterations == 2 and config.train.group_size == 4
    assert [spec.name for spec in config.reward] == ["exact_target"]
    summary = trainer.train()
    assert summary["iterations"] == 2 and summary["optimizer_steps"] > 0
    assert summary["heldout_samples"] == 8  # the 8 rows serve as the held-out set too
    rows = [json.loads(line) for line in (tmp_path / "run/metrics.jsonl").read_text().splitlines()]
    trained = [row for row in rows if "exact_target/mean" in row]
    assert len(trained) == 2 and all(0 <= row["exact_target/mean"] <= 1 for row in trained)
    # The base model solves some of these: a score of 0 everywhere would mean the column or
    # the completions never reached the function.
    assert summary["heldout_reward_before"] > 0
    saved = json.loads((tmp_path / "run/config.json").read_text())
    assert saved["reward"][0]["name"] == "exact_target"


def test_trl_arguments_map_to_dotted_keys() -> None:
    assert overrides_from_args(
        {"learning_rate": 1e-5, "beta": 0.04, "report_to": "wandb", "train.iterations": 3}
    ) == [
        "optim.lr=1e-05",
        "algorithm.kl_beta=0.04",
        'logging.report_to=["wandb"]',
        "train.iterations=3",
    ]
    assert overrides_from_args({"report_to": "none"}) == ["logging.report_to=[]"]
    with pytest.raises(ConfigError, match=r"args\.per_device_batch: not a TRL GRPOConfig"):
        overrides_from_args({"per_device_batch": 4})


def test_policy_follows_the_model(tmp_path: Path) -> None:
    assert policy_for("countdown_lm") == ("countdown_lm", None)
    diffusers_dir = tmp_path / "sd"
    diffusers_dir.mkdir()
    (diffusers_dir / "model_index.json").write_text("{}")
    assert policy_for(str(diffusers_dir)) == ("flow_image", str(diffusers_dir))
    lm = tmp_path / "lm"
    lm.mkdir()
    (lm / "config.json").write_text('{"model_type": "qwen3"}')
    assert policy_for(str(lm)) == ("causal_lm", str(lm))
    (lm / "config.json").write_text('{"model_type": "qwen2_vl", "vision_config": {}}')
    assert policy_for(str(lm)) == ("vlm", str(lm))


def test_build_config_switches_algorithm_and_takes_named_rewards() -> None:
    config = build_config(
        "toy_digits",
        ["digit_classifier"],
        ["train.iterations=3"],
        algorithm="ram",
        reward_weights=[2.0],
    )
    assert config.algorithm.name == "ram" and config.recipe == "digits_flow_grpo_api"
    assert config.reward[0].name == "digit_classifier" and config.reward[0].weight == 2.0
    assert config.prompts.dataset == "digits"  # no train_dataset: the recipe's prompts


def test_bad_calls_name_the_argument() -> None:
    with pytest.raises(ConfigError, match=r"reward_funcs\.0: unknown name 'countdwn'"):
        build_config("countdown_lm", ["countdwn"])
    with pytest.raises(ConfigError, match=r"reward_weights: 2 weights for 1"):
        build_config("countdown_lm", [exact_target], reward_weights=[1.0, 2.0])

    def countdown(prompts, completions, **kwargs):  # type: ignore[no-untyped-def]
        return [0.0] * len(prompts)

    with pytest.raises(ConfigError, match=r"'countdown' is the name of a registered reward"):
        build_config("countdown_lm", [countdown])
    assert isinstance(REWARDS["countdown"], str)  # the registry entry is untouched
    with pytest.raises(ValueError, match=r"no 'question' column"):
        build_config(
            "countdown_lm",
            [exact_target],
            {"prompts.column": "question"},
            train_dataset=countdown_dataset(2),
        )


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (
            {"reward_funcs": None},
            "reward_funcs: expected a reward function, a registered reward's name or a list of "
            "them, got None",
        ),
        (
            {"args": 5},
            "args: expected a mapping such as {'max_steps': 20} or a list of key=value strings, "
            "got 5 (an int)",
        ),
        (
            {"args": ["train.iterations=2", 3]},
            "args.1: expected a key=value string, got 3 (an int)",
        ),
        ({"args": {1: 2}}, "args: keys are setting names (strings), got 1 (an int)"),
        (
            {"model": 5},
            "model: expected a registered policy's name (countdown_lm, toy_digits, ...), a local "
            "model folder or a hub id, got 5 (an int)",
        ),
        ({"reward_weights": ["a"]}, "reward_weights.0: expected a number, got 'a' (a str)"),
        ({"reward_weights": [True]}, "reward_weights.0: expected a number, got True (a bool)"),
        (
            {"reward_weights": 2.0},
            "reward_weights: expected a list of numbers, one per reward function, got 2.0 "
            "(a float)",
        ),
        (
            {"train_dataset": 5},
            "train_dataset: expected a datasets.Dataset, a list of prompts or row dicts, or a "
            "file or prompt set name, got 5 (an int)",
        ),
        ({"algorithm": 3}, "algorithm: expected a name (a string), got 3 (an int)"),
        (
            {"args": {"train.dynamic_sampling": "yes"}},
            "train.dynamic_sampling: expected true or false, got 'yes'",
        ),
        (
            {"train_dataset": ["Use 1 2 3 to make 6:", " "]},
            "train_dataset: row 2 has an empty 'prompt'; give every row a prompt text or drop "
            "the row",
        ),
        (
            {"train_dataset": [{"prompt": ""}]},
            "train_dataset: row 1 has an empty 'prompt'; give every row a prompt text or drop "
            "the row",
        ),
    ],
)
def test_wrong_arguments_are_one_error_naming_the_argument(
    call: dict[str, object], message: str
) -> None:
    """Each of these raised a bare TypeError or ValueError from inside genrl or pathlib, or
    (the blank prompt) a reshape error from inside torch once training started."""
    arguments: dict[str, object] = {"model": "countdown_lm", "reward_funcs": [exact_target]}
    with pytest.raises((ConfigError, PromptFileError)) as info:  # both one line in the CLI
        build_config(**{**arguments, **call})  # type: ignore[arg-type]
    assert str(info.value) == message


def test_a_reward_function_returning_strings_or_booleans_is_refused() -> None:
    from reward_models import CallableReward, CompositeReward, RewardError

    def says_yes(completions, **kwargs):  # type: ignore[no-untyped-def]
        return [1.0, "yes"]

    def passed(completions, **kwargs):  # type: ignore[no-untyped-def]
        return [True, None]

    def numbers(completions, **kwargs):  # type: ignore[no-untyped-def]
        return [1, None]  # an int, and None for "not applicable": the contract

    with pytest.raises(ValueError) as info:
        CallableReward(says_yes)(["a", "b"], ["p", "q"])
    assert str(info.value) == (
        "reward function 'says_yes' returned 'yes' (str) for sample 1 of the 2 it scored; "
        "return a number per sample, or None where the reward does not apply"
    )
    # As training scores it: through the composite, named once more by the reward.
    with pytest.raises(RewardError, match=r"'passed' returned True \(bool\) for sample 0 of"):
        CompositeReward([(CallableReward(passed), 1.0)])(["a", "b"], ["p", "q"])
    result = CallableReward(numbers)(["a", "b"], ["p", "q"])
    assert result.scores["numbers"][0].item() == 1.0 and result.scores["numbers"][1].isnan()
    assert result.applicable["numbers"].tolist() == [True, False]


def test_reward_functions_are_called_as_trl_calls_them() -> None:
    from reward_models import CallableReward

    def trl_style(completions, **kwargs):  # type: ignore[no-untyped-def]
        return [float(len(c)) for c in completions]

    def positional(p, c):  # type: ignore[no-untyped-def]  # names of its own: by position
        return [float(len(x)) for x in c]

    for fn in (trl_style, positional):
        scores = CallableReward(fn)(["ab", "c"], ["p", "q"]).scores[fn.__name__]
        assert scores.tolist() == [2.0, 1.0]


def test_a_recipe_keeps_its_own_model_and_a_hub_id_gets_the_trl_defaults() -> None:
    config = build_config(
        "stabilityai/stable-diffusion-3.5-medium",
        ["pickscore"],
        algorithm="flow_grpo",
        recipe="sd35m_pickscore",
        train_dataset="prompts.txt",
    )
    assert config.policy.name == "sd3" and config.policy.kwargs["height"] == 512
    assert config.prompts.dataset == "prompts.txt" and config.algorithm.kl_beta == 0.01
    config = build_config("someone/some-lm", ["countdown"], {"max_completion_length": 64})
    assert (config.policy.name, config.policy.pretrained) == ("causal_lm", "someone/some-lm")
    assert config.generation is not None and config.generation.max_new_tokens == 64
    assert config.recipe == "qwen3_countdown_grpo_api" and config.policy.lora_rank == 16


def test_lists_serve_as_datasets_and_weights_may_come_in_args() -> None:
    from genrl.prompts.sources import load_prompts
    from tasks.prompt import prompt_columns

    config = build_config(
        "countdown_lm",
        [exact_target, "countdown"],
        {"reward_weights": [1.0, 0.5]},
        train_dataset=[{"prompt": "Use 1 2 3 to make 6:", "target": 6, "numbers": [1, 2, 3]}],
        eval_dataset=["Use 4 5 6 to make 26:", "Use 1 1 1 to make 3:"],
    )
    assert [(r.name, r.weight) for r in config.reward] == [
        ("exact_target", 1.0),
        ("countdown", 0.5),
    ]
    source = load_prompts(config.prompts.dataset, config.prompts.eval_dataset)
    assert [str(p) for p in source.train] == ["Use 1 2 3 to make 6:"]
    assert prompt_columns(source.train[0]) == {"target": 6, "numbers": [1, 2, 3]}
    assert [str(p) for p in source.eval] == ["Use 4 5 6 to make 26:", "Use 1 1 1 to make 3:"]
    name = config.prompts.eval_dataset
    assert source.heldout == f"the 2 prompts of {name}, none of them a training prompt"
