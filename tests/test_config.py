"""Tests of the typed config, dotted overrides and recipes."""

from __future__ import annotations

import json

import pytest

from genrl.algorithms import ALGORITHMS
from genrl.algorithms.flow_grpo import FlowGRPOConfig
from genrl.config.errors import ConfigError
from genrl.config.overrides import parse_assignment
from genrl.recipes import DEFAULT_RECIPE, RECIPES, get_recipe
from genrl.run.config import TrainConfig, algorithm_config
from genrl.run.config_file import config_from_dict


@pytest.fixture
def cfg() -> TrainConfig:
    return get_recipe("digits_flow_grpo")


# ---------------------------------------------------------------- recipes


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_recipes_validate(name):
    config = get_recipe(name)
    assert isinstance(config, TrainConfig)
    assert config.recipe == name
    assert type(config.algorithm) is ALGORITHMS[config.algorithm.name].Config
    config.validate()
    # Every recipe's batch divides over 1, 2, 4 and 8 processes (the replay store runs on one:
    # tests/test_replay.py checks that it says so).
    for processes in (1,) if config.replay.enabled else (1, 2, 4, 8):
        config.validate(num_processes=processes)


def test_default_recipe_and_fresh_copies():
    assert DEFAULT_RECIPE == "digits_flow_grpo"
    a, b = get_recipe(DEFAULT_RECIPE), get_recipe(DEFAULT_RECIPE)
    a.optim.lr = 123.0
    assert b.optim.lr == 1e-4  # each call builds a new config


def test_unknown_recipe_suggests_close_name():
    with pytest.raises(ConfigError, match="Did you mean 'digits_flow_grpo'"):
        get_recipe("digits_flowgrpo")


# ---------------------------------------------------------------- overrides: values


def test_float_override(cfg):
    cfg.apply_overrides(["optim.lr=1e-4"])
    assert cfg.optim.lr == 1e-4 and type(cfg.optim.lr) is float
    cfg.apply_overrides(["optim.lr=3"])
    assert cfg.optim.lr == 3.0 and type(cfg.optim.lr) is float


def test_int_override(cfg):
    assert cfg.apply_overrides(["train.iterations=3"]) is cfg
    assert cfg.train.iterations == 3 and type(cfg.train.iterations) is int
    # A float literal with an integral value is accepted as an int.
    cfg.apply_overrides(["train.iterations=1e2"])
    assert cfg.train.iterations == 100 and type(cfg.train.iterations) is int


def test_optional_overrides(cfg):
    cfg.apply_overrides(["optim.max_grad_norm=none"])
    assert cfg.optim.max_grad_norm is None
    cfg.apply_overrides(["optim.max_grad_norm=0.5", "optim.ema_decay=0.9"])
    assert cfg.optim.max_grad_norm == 0.5 and cfg.optim.ema_decay == 0.9
    cfg.apply_overrides(["policy.pretrained=Null"])
    assert cfg.policy.pretrained is None
    cfg.apply_overrides(["policy.pretrained=/models/sd3"])
    assert cfg.policy.pretrained == "/models/sd3"
    cfg.validate()


def test_literal_override(cfg):
    cfg.apply_overrides(["sampler.log_prob_reduction=sum"])
    assert cfg.sampler.log_prob_reduction == "sum"


def test_list_overrides(cfg):
    cfg.apply_overrides(["optim.betas=[0.8,0.9]"])
    assert cfg.optim.betas == [0.8, 0.9]
    assert all(type(b) is float for b in cfg.optim.betas)
    cfg.apply_overrides(["optim.betas=0.5,0.6"])
    assert cfg.optim.betas == [0.5, 0.6]
    cfg.apply_overrides(["optim.betas.1=0.99"])
    assert cfg.optim.betas == [0.5, 0.99]
    cfg.apply_overrides(["policy.lora_target_modules=to_q,to_v"])
    assert cfg.policy.lora_target_modules == ["to_q", "to_v"]


def test_bool_override(cfg):
    cfg.apply_overrides(["logging.tensorboard=false"])
    assert cfg.logging.tensorboard is False
    cfg.apply_overrides(["logging.tensorboard=true"])
    assert cfg.logging.tensorboard is True
    # JSON list items reach the item type as JSON text, so [true] stays a boolean's spelling.
    from genrl.config.overrides import parse_value

    assert parse_value("[true, false]", list[bool], "flags") == [True, False]


@pytest.mark.parametrize("spelling", ["yes", "no", "on", "off", "1", "0", "True", "FALSE", "maybe"])
def test_bool_override_takes_only_json_spellings(cfg, spelling):
    """``yes`` was once read as true; a boolean now takes what config.json takes."""
    before = cfg.train.dynamic_sampling
    with pytest.raises(ConfigError) as info:
        cfg.apply_overrides([f"train.dynamic_sampling={spelling}"])
    assert str(info.value) == (f"train.dynamic_sampling: expected true or false, got {spelling!r}")
    assert cfg.train.dynamic_sampling is before


def test_reward_list_overrides(cfg):
    cfg.apply_overrides(["reward.0.weight=2"])
    assert cfg.reward[0].weight == 2.0 and type(cfg.reward[0].weight) is float
    # kwargs is a free-form dict: new keys are allowed, values parsed as JSON when possible.
    cfg.apply_overrides(["reward.0.kwargs.path=/x", "reward.0.kwargs.batch=4"])
    assert cfg.reward[0].kwargs == {"path": "/x", "batch": 4}
    # One past the end adds an entry with default fields; further is an error.
    cfg.apply_overrides(["reward.1.name=target_color"])
    assert [r.name for r in cfg.reward] == [cfg.reward[0].name, "target_color"]
    with pytest.raises(ConfigError, match="index below 2"):
        cfg.apply_overrides(["reward.3.weight=2"])


def test_algorithm_overrides(cfg):
    cfg.apply_overrides(["algorithm.clip_range=1e-5"])
    assert cfg.algorithm.clip_range == 1e-5
    cfg.apply_overrides(["algorithm.std_mode=global", "algorithm.clip_range_high=0.3"])
    assert cfg.algorithm.std_mode == "global" and cfg.algorithm.clip_range_high == 0.3
    # Naming the algorithm replaces the whole section with that algorithm's defaults.
    cfg.apply_overrides(["algorithm.name=flow_grpo"])
    assert cfg.algorithm == FlowGRPOConfig()
    assert cfg.algorithm.clip_range == 1e-4 and cfg.algorithm.std_mode == "global"
    assert algorithm_config("flow_grpo") == FlowGRPOConfig()
    with pytest.raises(ConfigError, match=r"algorithm\.name"):
        cfg.apply_overrides(["algorithm.name=flow_grpo_fast"])


def test_overrides_apply_in_order(cfg):
    cfg.apply_overrides(["train.iterations=3", "train.iterations=5", " seed = 7 "])
    assert cfg.train.iterations == 5 and cfg.seed == 7


# ---------------------------------------------------------------- overrides: errors


def test_unknown_key_names_the_path_and_lists_lr(cfg):
    with pytest.raises(ConfigError) as info:
        cfg.apply_overrides(["optim.learning_rate=1e-4"])
    message = str(info.value)
    assert "optim.learning_rate" in message
    assert "lr" in message.split("Valid keys here:")[1]


def test_unknown_key_learning_rate_suggests_lr(cfg):
    with pytest.raises(ConfigError, match="Did you mean 'lr'"):
        cfg.apply_overrides(["optim.learning_rate=1e-4"])


def test_misspelled_key_suggests_close_name(cfg):
    with pytest.raises(ConfigError, match="Did you mean 'clip_range'"):
        cfg.apply_overrides(["algorithm.clip_rang=1e-4"])


def test_unknown_section_suggests_close_name(cfg):
    with pytest.raises(ConfigError, match=r"unknown config key 'optimizer'\. Did you mean 'optim'"):
        cfg.apply_overrides(["optimizer.lr=1e-4"])
    with pytest.raises(ConfigError, match="unknown config key 'zzz'"):
        cfg.apply_overrides(["zzz.lr=1e-4"])


def test_setting_a_section_is_an_error(cfg):
    with pytest.raises(ConfigError, match="is a section"):
        cfg.apply_overrides(["optim=3"])


def test_bad_int(cfg):
    with pytest.raises(ConfigError, match=r"train\.iterations: expected an integer"):
        cfg.apply_overrides(["train.iterations=2.5"])
    with pytest.raises(ConfigError, match="expected a number"):
        cfg.apply_overrides(["train.iterations=many"])
    with pytest.raises(ConfigError, match=r"optim\.lr"):
        cfg.apply_overrides(["optim.lr=fast"])
    with pytest.raises(ConfigError, match="cannot parse"):
        cfg.apply_overrides(["optim.max_grad_norm=big"])


def test_bad_literal_suggests_close_choice(cfg):
    with pytest.raises(ConfigError, match="Did you mean 'sum'"):
        cfg.apply_overrides(["sampler.log_prob_reduction=summ"])
    with pytest.raises(ConfigError, match="Did you mean 'cosine'"):
        cfg.apply_overrides(["optim.lr_schedule=cosin"])


def test_assignment_without_equals_sign(cfg):
    with pytest.raises(ConfigError, match="key=value"):
        cfg.apply_overrides(["train.iterations"])
    with pytest.raises(ConfigError, match="key=value"):
        parse_assignment("=3")
    assert parse_assignment("a.b = x=y") == ("a.b", "x=y")


# ---------------------------------------------------------------- validation


@pytest.mark.parametrize(
    ("override", "field"),
    [
        ("train.iterations=0", "train.iterations"),
        ("train.group_size=-1", "train.group_size"),
        ("sampler.num_steps=0", "sampler.num_steps"),
        ("optim.lr=0", "optim.lr"),
        ("optim.betas=[0.9,1.0]", "optim.betas"),
        ("optim.betas=[0.9]", "optim.betas"),
        ("optim.ema_decay=1", "optim.ema_decay"),
        ("optim.max_grad_norm=0", "optim.max_grad_norm"),
        ("sampler.noise_level=-0.1", "sampler.noise_level"),
        ("sampler.shift=0", "sampler.shift"),
        ("sampler.guidance_scale=0.5", "sampler.guidance_scale"),
        ("policy.lora_rank=-1", "policy.lora_rank"),
        ("algorithm.clip_range=-0.1", "algorithm.clip_range"),
        ("algorithm.clip_range_high=0", "algorithm.clip_range_high"),
        ("algorithm.kl_beta=-1", "algorithm.kl_beta"),
        ("algorithm.timestep_fraction=0", "algorithm.timestep_fraction"),
        ("algorithm.stat_history=0", "algorithm.stat_history"),
    ],
)
def test_validation_errors_name_the_field(cfg, override, field):
    cfg.apply_overrides([override])
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        cfg.validate()


def test_global_batch_must_divide_over_processes(cfg):
    # 16 prompts x 8 samples = 128, not divisible by 3.
    with pytest.raises(ConfigError, match="128 samples per iteration"):
        cfg.validate(num_processes=3)
    # 3 prompts x 8 = 24 is divisible by 3.
    cfg.apply_overrides(["train.prompts_per_iteration=3"])
    cfg.validate(num_processes=3)


def test_empty_reward_list_is_rejected(cfg):
    cfg.reward = []
    with pytest.raises(ConfigError, match="reward"):
        cfg.validate()


# ---------------------------------------------------------------- dict round trip


def test_to_dict_round_trip(cfg):
    cfg.apply_overrides(
        [
            "optim.max_grad_norm=none",
            "optim.betas=[0.8,0.9]",
            "reward.0.kwargs.path=/x",
            "algorithm.clip_range_high=0.01",
            "sampler.log_prob_reduction=sum",
        ]
    )
    data = cfg.to_dict()
    assert data["algorithm"]["name"] == "flow_grpo"
    assert data["reward"] == [{"name": "digit_classifier", "weight": 1.0, "kwargs": {"path": "/x"}}]
    rebuilt = config_from_dict(data)
    assert rebuilt == cfg
    assert isinstance(rebuilt.algorithm, FlowGRPOConfig)
    # Through JSON (a run's config.json) as well.
    assert config_from_dict(json.loads(json.dumps(data))) == cfg


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_recipe_round_trip(name):
    config = get_recipe(name)
    assert config_from_dict(config.to_dict()) == config


def test_unknown_key_in_dict(cfg):
    data = cfg.to_dict()
    data["learning_rate"] = 1.0
    with pytest.raises(ConfigError, match="learning_rate"):
        config_from_dict(data)
    data = cfg.to_dict()
    data["optim"]["learnin_rate"] = 1.0
    with pytest.raises(ConfigError, match=r"optim\.learnin_rate"):
        config_from_dict(data)
    data = cfg.to_dict()
    data["reward"][0]["wieght"] = 1.0
    with pytest.raises(ConfigError, match=r"reward\.0\.wieght.*Did you mean 'weight'"):
        config_from_dict(data)
    data = cfg.to_dict()
    data["algorithm"]["clip"] = 1.0
    with pytest.raises(ConfigError, match=r"algorithm\.clip"):
        config_from_dict(data)


def test_unknown_algorithm_name_in_dict(cfg):
    data = cfg.to_dict()
    data["algorithm"]["name"] = "flow_grp"
    with pytest.raises(ConfigError, match="Did you mean 'flow_grpo'"):
        config_from_dict(data)


@pytest.mark.parametrize("data", [{"seed": 3}, {"algorithm": {"clip_range": 1e-3}}])
def test_dict_without_algorithm_name_gives_config_error(data):
    with pytest.raises(ConfigError, match="algorithm"):
        config_from_dict(data)


# ---------------------------------------------------------------- rollout sections


def test_each_run_holds_only_its_rollouts_sections():
    """A token run has no flow sampler fields and a flow run no generation fields; each section
    is the class its rollout reads (Algorithm.sections)."""
    from genrl.rollouts.tokens import GenerationConfig
    from genrl.run.config import FlowSamplingConfig, SDESamplingConfig, UnmaskingConfig

    for name in RECIPES:
        config = get_recipe(name)
        needed = ALGORITHMS[config.algorithm.name].sections
        for section in ("sampler", "generation"):
            value = getattr(config, section)
            assert (value is None) == (section not in needed), (name, section)
            assert value is None or type(value) is needed[section], (name, section)
    lm = get_recipe("llm_countdown_grpo").to_dict()
    assert lm["sampler"] is None and type(get_recipe("llm_countdown_grpo").generation) is (
        GenerationConfig
    )
    assert "diffusion_steps" not in lm["generation"] and "top_p" in lm["generation"]
    assert "top_p" not in get_recipe("dllm_sudoku_maskgrpo").to_dict()["generation"]
    assert get_recipe("digits_flow_grpo").to_dict()["generation"] is None
    assert type(get_recipe("digits_ram").sampler) is FlowSamplingConfig
    assert "noise_level" not in get_recipe("digits_ram").to_dict()["sampler"]
    assert type(get_recipe("digits_flow_grpo").sampler) is SDESamplingConfig
    assert UnmaskingConfig is not GenerationConfig


def test_a_key_of_a_section_the_run_does_not_have_is_named():
    lm = get_recipe("llm_countdown_grpo")
    with pytest.raises(
        ConfigError,
        match=r"sampler\.num_steps: grpo has no sampler section; its rollout reads "
        r"generation\.\*",
    ):
        lm.apply_overrides(["sampler.num_steps=5"])
    flow = get_recipe("digits_flow_grpo")
    with pytest.raises(ConfigError, match="flow_grpo has no generation section"):
        flow.apply_overrides(["generation.temperature=0.7"])
    # BranchGRPO's trees have no SDE window: the key is unknown, with the valid ones listed.
    with pytest.raises(ConfigError, match=r"unknown config key 'sampler\.sde_window_size'"):
        get_recipe("digits_branch_grpo").apply_overrides(["sampler.sde_window_size=2"])
    # A section of the wrong class (set by hand) is named by validate().
    from genrl.run.config import FlowSamplingConfig

    flow.sampler = FlowSamplingConfig()
    with pytest.raises(ConfigError, match="sampler: flow_grpo reads it as SDESamplingConfig"):
        flow.validate()


def test_switching_algorithms_refits_the_sections():
    """flow_grpo -> ram keeps what the two samplers share (steps, shift, guidance) and drops
    the SDE fields; ram -> flow_grpo restores defaults for them; -> grpo swaps the section."""
    from genrl.run.config import FlowSamplingConfig, SDESamplingConfig

    config = get_recipe("digits_flow_grpo")
    config.apply_overrides(["sampler.num_steps=7", "sampler.sde_window_size=2"])
    config.apply_overrides(["algorithm.name=ram"])
    assert type(config.sampler) is FlowSamplingConfig and config.sampler.num_steps == 7
    config.apply_overrides(["algorithm.name=flow_grpo"])
    assert type(config.sampler) is SDESamplingConfig
    assert (config.sampler.num_steps, config.sampler.sde_window_size) == (7, 0)
    config.apply_overrides(["algorithm.name=grpo"])
    assert config.sampler is None and config.generation is not None
    config.validate()


def test_a_stray_section_in_a_config_file_is_refused():
    data = get_recipe("llm_countdown_grpo").to_dict()
    data["sampler"] = {"num_steps": 10}
    with pytest.raises(ConfigError, match="sampler: grpo has no sampler section"):
        config_from_dict(data)
    data = get_recipe("digits_flow_grpo").to_dict()
    data["sampler"]["top_p"] = 0.9
    with pytest.raises(ConfigError, match=r"sampler\.top_p"):
        config_from_dict(data)


def test_a_remote_reward_spelled_on_the_command_line(cfg):
    """docs/rewards.md's CLI spelling of a served reward builds the remote reward's kwargs."""
    cfg.apply_overrides(
        [
            "reward.0.name=remote",
            "reward.0.kwargs.url=http://127.0.0.1:8000",
            "reward.0.kwargs.name=digit_classifier",
        ]
    )
    assert cfg.reward[0].name == "remote"
    assert cfg.reward[0].kwargs == {"url": "http://127.0.0.1:8000", "name": "digit_classifier"}
