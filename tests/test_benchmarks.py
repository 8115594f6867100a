"""Smoke runs of the benchmark scripts at tiny settings: they run to the end and their last line
of output is the JSON object with the keys the issues track."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run_benchmark(name: str, *args: str) -> dict:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    env["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT), str(ROOT / "benchmarks"), *filter(None, [env.get("PYTHONPATH")])]
    )
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / name), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_ddim_overhead_quick_ends_with_its_json_line() -> None:
    summary = run_benchmark(
        "ddim_overhead.py", "--quick", *("--steps", "2", "--batch", "2", "--group-size", "2")
    )
    assert set(summary["rollout_over_pipe_time_ratio_by_family"]) == {"sd", "sdxl"}
    assert summary["max_rollout_over_pipe_time_ratio"] > 0 and summary["target"] == 1.1


@pytest.mark.slow
def test_video_overhead_quick_ends_with_its_json_line() -> None:
    summary = run_benchmark(
        "video_overhead.py",
        "--quick",
        "--profile",
        *("--steps", "2", "--batch", "2", "--group-size", "2", "--frames", "1"),
        *("--height", "32", "--width", "32", "--max-sequence-length", "16"),
        *("--repeats", "1", "--warmup", "0", "--decode-repeats", "1", "--decode-chunk", "1"),
        *("--memory-frames", "5", "--lora-rank", "4", "--lora-alpha", "8"),
    )
    assert summary["benchmark"] == "video_overhead"
    assert summary["rollout_over_pipe_time_ratio"] > 0
    assert summary["target_ratio"] == 1.1
    assert set(summary["phases_ms"]) == {"ours", "pipe"}
    assert summary["decode_max_abs_difference"] < 1e-4  # our decode is the pipeline's
    memory = summary["peak_memory_mb_by_frames"]
    if sys.platform == "linux":
        assert set(memory) == {"5"}
        for row in memory.values():
            assert {"rollout", "decode", "pipe_rollout", "pipe_decode"} <= set(row)
            assert all(value >= 0 for value in row.values())
    assert summary["latent_shape"] == [4, 1, 4, 4]
    families = summary["rollout_over_pipe_time_ratio_by_family"]
    assert set(families) == {"ltx", "hunyuan_video15", "wan_a14b"}
    assert all(ratio > 0 for ratio in families.values())


@pytest.mark.slow
def test_rubric_benchmark_ends_with_its_json_line() -> None:
    summary = run_benchmark("rubric.py", "--samples", "2", "--repeats", "1", "--latency-ms", "1")
    assert summary["benchmark"] == "rubric" and summary["criteria"] == 5
    assert summary["batched_speedup"] > 0
    for backend in ("local", "endpoint"):
        row = summary[backend]
        # Two samples: 2 extractions + 6 judge questions one by one.
        assert row["judge_calls_one_by_one"] == 8 and row["max_score_difference"] < 1e-5
    assert summary["local"]["judge_calls_batched"] == 3  # extraction, text judges, image judge


@pytest.mark.slow
def test_reference_memory_ends_with_its_json_line() -> None:
    summary = run_benchmark("reference_memory.py", "--no-iteration")
    assert summary["benchmark"] == "reference_memory"
    runs = summary["runs"]
    assert runs["kl0"]["reference_bytes"] == {}  # no frozen copy at kl_beta=0
    assert runs["kl"]["reference_bytes"] == {"cpu": runs["kl"]["network_bytes"]}
    assert summary["device_bytes_kl0_over_before"] == 0.5


@pytest.mark.slow
def test_reward_overlap_quick_ends_with_its_json_line() -> None:
    summary = run_benchmark("reward_overlap.py", "--quick", "--seconds-per-image", "0.01")
    assert summary["benchmark"] == "reward_overlap"
    # 4 samples in chunks of 1: the last chunk's scoring is never hidden.
    assert summary["chunks"] == 4 and summary["max_hidden_fraction"] == 0.75
    assert summary["reward_s_per_image"] == 0.01
    assert summary["reward_s_per_iteration"] >= 0.04  # four images of 10 ms each
    assert summary["serial_iteration_s"] > 0 and summary["overlapped_iteration_s"] > 0
    assert summary["target_hidden_fraction"] == 0.8


def test_cli_startup_ends_with_its_json_line() -> None:
    summary = run_benchmark("cli_startup.py", "--repeats", "1")
    assert summary["benchmark"] == "cli_startup" and summary["repeats"] == 1
    assert summary["help_seconds"] > 0 and summary["python_seconds"] > 0
    assert summary["config_error_seconds"] > 0
    ratio = summary["help_seconds"] / summary["python_seconds"]
    assert abs(summary["help_over_python_ratio"] - ratio) < 0.01


@pytest.mark.slow  # a server and the in-process baseline at two concurrencies: about 5 s
def test_reward_server_benchmark_ends_with_its_json_line() -> None:
    summary = run_benchmark(
        "reward_server.py",
        *("--concurrency", "1,2", "--requests", "2", "--repeats", "1", "--images", "2"),
        *("--size", "8", "--batch-ms", "1"),
    )
    assert summary["benchmark"] == "reward_server" and summary["scores_equal"] is True
    ratios = summary["throughput_ratio_by_concurrency"]
    assert set(ratios) == {"1", "2"} and summary["throughput_ratio"] == ratios["2"] > 0
    for way in ("served", "in_process"):
        for row in summary[way].values():  # 2 images per request
            assert row["images_per_s"] == pytest.approx(2 * row["requests_per_s"], rel=0.01)


@pytest.mark.slow  # a server and two levels of a second each: about 8 s
def test_reward_server_slow_clients_benchmark_ends_with_its_json_line() -> None:
    summary = run_benchmark(
        "reward_server_slow_clients.py", *("--levels", "0,4", "--seconds", "1", "--images", "1")
    )
    assert summary["benchmark"] == "reward_server_slow_clients"
    assert summary["slow_clients_survived"] == 4  # both levels served within 1 s
    row = summary["levels"]["4"]
    assert row["slow_connected"] == 4 and set(row["statuses"]) == {"200"}
    assert summary["healthy_p99_ms_at_survived"] == row["latency_ms_p99"] < 1000
    assert summary["settings"]["header_timeout_s"] == 10.0  # the server's default, from /health


def _gpu_scale_out():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import gpu_scale_out

    return gpu_scale_out


def _fake_run(directory: Path, losses: list[float], norms: list[float], reward: float) -> Path:
    directory.mkdir(parents=True)
    rows = [{"iteration": 0, "eval/reward": 0.1}]
    rows += [
        {"iteration": i + 1, "loss/total": loss, "grad_norm": norm}
        for i, (loss, norm) in enumerate(zip(losses, norms, strict=True))
    ]
    (directory / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (directory / "summary.json").write_text(json.dumps({"heldout_reward_after": reward}))
    for rank, gb in enumerate((1.5, 1.25)):
        (directory / f"peak_memory_rank{rank}.json").write_text(json.dumps({"gb": gb}))
    return directory


def test_gpu_scale_out_compares_a_run_with_ddp_by_hand(tmp_path: Path) -> None:
    """Losses relative to the largest DDP loss (0.5): 0.0005 / 0.5 = 1e-3; gradient norms
    each relative to DDP's: 0.1 / 1.0 = 0.1 beats 0 / 2.0; reward 0.27 - 0.25 = 0.02."""
    bench = _gpu_scale_out()
    ddp = bench.read_run(_fake_run(tmp_path / "ddp", [0.5, -0.25], [2.0, 1.0], 0.25))
    zero = bench.read_run(_fake_run(tmp_path / "zero2", [0.5005, -0.25], [2.0, 1.1], 0.27))
    assert ddp["losses"] == [0.5, -0.25] and ddp["peak_memory_gb"] == [1.5, 1.25]
    diff = bench.compare(zero, ddp)
    assert diff["max_rel_loss_diff"] == pytest.approx(1e-3)
    assert diff["max_rel_grad_norm_diff"] == pytest.approx(0.1)
    assert diff["heldout_reward_diff"] == pytest.approx(0.02)
    assert bench.compare(ddp, ddp) == {
        "max_rel_loss_diff": 0.0,
        "max_rel_grad_norm_diff": 0.0,
        "heldout_reward_diff": 0.0,
    }
    short = bench.read_run(_fake_run(tmp_path / "short", [0.5], [2.0], 0.25))
    with pytest.raises(ValueError, match="logged 1 and 2 iterations"):
        bench.compare(short, ddp)
    # A CUDA run's summary carries its plan (logging.plan): 3 GiB planned, 1.5 GiB measured.
    planned = _fake_run(tmp_path / "planned", [0.5], [2.0], 0.25)
    plan = {"made": True, "planned_bytes": {"total": 3 * 2**30}, "strategy": "DDP",
            "setup": "full", "measured_over_planned": 0.5}  # fmt: skip
    summary = {"heldout_reward_after": 0.25, "plan": plan}
    (planned / "summary.json").write_text(json.dumps(summary))
    row = bench.read_run(planned)
    assert (row["planned_gb"], row["planned_strategy"]) == (3.0, "DDP, full")
    assert row["measured_over_planned"] == 0.5 and "planned_gb" not in ddp


def test_gpu_scale_out_builds_one_launch_per_config(tmp_path: Path) -> None:
    bench = _gpu_scale_out()
    args = bench.parse_args(["--num-processes", "2", "--configs", "zero3", "fsdp2_lora"])
    commands = bench.build_commands(args, tmp_path, ["policy.pretrained=/m/sd3"])
    # Each compared run has its DDP baseline of the same fine-tuning mode, run first.
    assert list(commands) == ["ddp", "ddp_lora", "zero3", "fsdp2_lora"]
    for run, config, lora in [("ddp", "ddp", 0), ("ddp_lora", "ddp", 4), ("zero3", "zero3", 0),
                              ("fsdp2_lora", "fsdp2_lora", 4)]:  # fmt: skip
        command = commands[run]
        assert command[1:3] == ["-m", "accelerate.commands.launch"]
        config_file = command[command.index("--config_file") + 1]
        assert config_file == str(ROOT / "genrl" / "launch_configs" / f"{config}.yaml")
        assert command[command.index("--num_processes") + 1] == "2"
        assert command[command.index("--worker") + 1] == str(tmp_path / run)
        sets = [command[i + 1] for i, arg in enumerate(command) if arg == "--set"]
        assert f"policy.lora_rank={lora}" in sets and "train.iterations=2" in sets
        assert sets[0] == "policy.pretrained=/m/sd3"
    assert bench.baseline_of("fsdp2_lora") == "ddp_lora" and bench.baseline_of("zero2") == "ddp"
    with pytest.raises(SystemExit):
        bench.parse_args(["--configs", "zero4"])
    with pytest.raises(SystemExit):
        bench.parse_args(["--num-processes", "0"])
    worker = bench.parse_args(["--worker", "d", "--", "train", "--set", "a=1"])
    assert worker.cli_args == ["train", "--set", "a=1"] and worker.overrides == []


@pytest.mark.skipif(
    __import__("torch").cuda.is_available(), reason="checks the refusal on a machine without CUDA"
)
@pytest.mark.slow  # two launches of the script: about 12 s
def test_gpu_scale_out_refuses_without_cuda_and_dry_runs(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CUDA_VISIBLE_DEVICES": ""}
    script = [sys.executable, str(ROOT / "benchmarks" / "gpu_scale_out.py")]
    refused = subprocess.run(script, env=env, capture_output=True, text=True, check=False)
    assert refused.returncode == 2
    assert refused.stdout.strip().splitlines() == [
        "gpu_scale_out: needs a CUDA GPU and none is visible (--dry-run prints the commands)"
    ]
    dry = [*script, "--dry-run", "--out", str(tmp_path)]
    done = subprocess.run(dry, env=env, capture_output=True, text=True, check=True)
    lines = done.stdout.strip().splitlines()
    assert json.loads(lines[-1])["runs"] == ["ddp", "ddp_lora", "fsdp2_full", "fsdp2_lora",
                                             "zero2", "zero3"]  # fmt: skip
    assert len(lines) == 7 and all("accelerate.commands.launch" in line for line in lines[:6])
    assert not (tmp_path / "models").exists()  # a dry run builds nothing


@pytest.mark.slow
def test_gpu_scale_out_worker_trains_the_tiny_sd3_on_cpu(tmp_path: Path) -> None:
    """One launched process of the benchmark, without accelerate and on the CPU: the recipe
    overrides it passes are valid, and read_run finds what compare needs."""
    from diffusers_tiny import tiny_sd3_overrides

    bench = _gpu_scale_out()
    args = bench.parse_args(["--configs", "ddp", "--num-processes", "1", "--iterations", "1"])
    models = tiny_sd3_overrides(tmp_path / "models")
    command = bench.build_commands(args, tmp_path, models)["ddp"]
    worker = command[command.index("--num_processes") + 2 :]  # the script and its arguments
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    env.pop("ACCELERATE_USE_FSDP", None)
    done = subprocess.run([sys.executable, *worker], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    run = bench.read_run(tmp_path / "ddp")
    assert len(run["losses"]) == len(run["grad_norms"]) == 1 and run["grad_norms"][0] > 0
    assert len(run["peak_memory_gb"]) == 1
