"""A run plans itself (``logging.plan``, genrl/loop/run_plan.py) from a local checkpoint's own
configs (genrl/planning/local_models.py): the fake-tensor model has the loaded pipeline's
parameter counts, the run's ``plan.json`` is ``genrl plan``'s row for its setup, and
``summary.json`` and ``report.html`` carry it with what the run could measure."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from genrl.config.errors import ConfigError
from genrl.loop.run_plan import NOMINAL_GPU_MEMORY, run_strategy
from genrl.planning.choice import Setup
from genrl.planning.local_models import spec_from_directory
from genrl.planning.modelling import build_component, parameter_count
from genrl.planning.plan import plan
from tests.diffusers_tiny import build_wan, tiny_sd3_run
from tests.test_causal_lm import save_tiny_lm


@pytest.fixture(scope="module")
def sd3_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("plan_sd3")
    tiny_sd3_run(directory)  # builds the pipeline and the reward's CLIP under directory
    return directory


def _counts(spec) -> dict[str, int]:  # type: ignore[no-untyped-def]
    with FakeTensorMode():
        return {c.name: parameter_count(build_component(c, torch.float32)) for c in spec.components}


def test_a_local_pipeline_is_planned_with_its_own_sizes(sd3_dir: Path, tmp_path: Path) -> None:
    import diffusers

    for directory in (sd3_dir / "sd3", build_wan(tmp_path / "wan")):
        spec = spec_from_directory(directory)
        pipe = diffusers.DiffusionPipeline.from_pretrained(directory)
        loaded = {name: sum(p.numel() for p in getattr(pipe, name).parameters()) for name in
                  _counts(spec)}  # fmt: skip
        assert _counts(spec) == loaded
        assert [c.name for c in spec.components if c.trained] == ["transformer"]
    assert spec_from_directory(sd3_dir / "sd3").family == "sd3"
    assert spec.family == "wan"


def test_a_local_language_model_is_planned_as_its_family(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    directory = save_tiny_lm(tmp_path / "lm")
    spec = spec_from_directory(directory)
    model = AutoModelForCausalLM.from_pretrained(directory)
    assert spec.family == "causal_lm"
    assert _counts(spec) == {"model": sum(p.numel() for p in model.parameters())}
    assert spec_from_directory(directory, "masked_lm").family == "masked_lm"


def test_folders_the_planner_cannot_read_fail_in_one_line(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"neither model_index\.json"):
        spec_from_directory(tmp_path)
    (tmp_path / "model_index.json").write_text(json.dumps({"_class_name": "SanaPipeline"}))
    with pytest.raises(ConfigError, match="SanaPipeline"):
        spec_from_directory(tmp_path)


def _accelerator(processes: int, kind: str = "MULTI_GPU", **state) -> SimpleNamespace:  # type: ignore[no-untyped-def]
    return SimpleNamespace(
        num_processes=processes, distributed_type=kind, state=SimpleNamespace(**state)
    )


def test_the_run_strategy_is_named_as_the_planner_names_it(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.delenv("ACCELERATE_USE_FSDP", raising=False)
    assert run_strategy(_accelerator(1, "NO")) == "1 GPU"
    assert run_strategy(_accelerator(4)) == "DDP"
    zero = SimpleNamespace(deepspeed_config={"zero_optimization": {"stage": 3}}, zero_stage=3)
    assert run_strategy(_accelerator(8, "DistributedType.DEEPSPEED", deepspeed_plugin=zero)) == (
        "ZeRO-3"
    )
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    for reshard, name in ((True, "FSDP2"), (False, "FSDP2-SGO")):
        fsdp = SimpleNamespace(reshard_after_forward=reshard)
        assert run_strategy(_accelerator(2, "FSDP", fsdp_plugin=fsdp)) == name


def test_a_cpu_run_writes_its_plan_and_says_what_it_cannot_measure(
    sd3_dir: Path, tmp_path: Path
) -> None:
    from accelerate.state import AcceleratorState

    from genrl.loop.trainer import Trainer

    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a red cube\na blue ball\n")
    config = tiny_sd3_run(
        sd3_dir, "train.iterations=1", "logging.plan=on", f"prompts.dataset={prompts}",
        f"prompts.eval_dataset={prompts}", "sampler.num_steps=3", "sampler.eval_num_steps=3",
        "train.prompts_per_iteration=2", "train.group_size=2", "train.minibatch_size=4",
    )  # fmt: skip
    run = tmp_path / "run"
    AcceleratorState._reset_state(reset_partial_state=True)
    Trainer(config, run_dir=run).train()
    record = json.loads((run / "plan.json").read_text())
    expected = plan(config, 1, NOMINAL_GPU_MEMORY)
    setup = Setup(config.policy.lora_rank > 0, config.policy.gradient_checkpointing)
    row = next(r for r in expected.rows if r.setup == setup)
    assert (record["strategy"], record["setup"]) == ("1 GPU", setup.label)
    assert record["planned_bytes"]["total"] == row.memory.total > 0
    assert record["step_flops"] == row.flops
    summary = json.loads((run / "summary.json").read_text())
    assert summary["plan"]["planned_bytes"] == record["planned_bytes"]
    assert summary["plan"]["measured_peak_bytes"] is None
    assert "CPU" in summary["plan"]["measured_why"]
    page = (run / "report.html").read_text(encoding="utf-8")
    assert '<section id="plan">' in page and "1 GPU" in page


def test_auto_leaves_a_cpu_run_unplanned_and_on_refuses_an_embedded_model(
    tmp_path: Path,
) -> None:
    from genrl import get_recipe
    from genrl.loop.run_plan import plan_run

    config = get_recipe("digits_flow_grpo")
    cpu = SimpleNamespace(device=torch.device("cpu"), num_processes=1)
    assert plan_run(config, cpu, tmp_path)["made"] is False
    assert not (tmp_path / "plan.json").exists()
    config.logging.plan = "on"
    with pytest.raises(ConfigError, match="embedded model"):
        plan_run(config, cpu, tmp_path)


def test_auto_on_cuda_reports_why_a_model_is_not_planned_and_trains_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under ``auto`` a CUDA run of a model the planner cannot build gets a reason, never an
    error: the plan is a report (the CUDA device is simulated; nothing runs on it)."""
    from genrl import get_recipe
    from genrl.loop.run_plan import plan_run, summary_line

    sana = tmp_path / "sana"
    sana.mkdir()
    (sana / "model_index.json").write_text(json.dumps({"_class_name": "SanaPipeline"}))
    memory = SimpleNamespace(total_memory=80 * 2**30)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: memory)
    cuda = SimpleNamespace(device=torch.device("cuda"), num_processes=1)
    config = get_recipe("sd35m_pickscore").apply_overrides([f"policy.pretrained={sana}"])
    record = plan_run(config, cuda, tmp_path)
    assert record["made"] is False and "SanaPipeline" in record["why"]
    assert summary_line(record).startswith("genrl: no plan of this run (")
    assert not (tmp_path / "plan.json").exists()
