"""A plan as a table that fits on a screen, and as JSON."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from genrl.planning.choice import Row
from genrl.planning.plan import Plan

GIB = 2**30


def _gib(n: int) -> str:
    return f"{n / GIB:6.1f}"


def _seconds(s: float) -> str:
    return f"{s * 1e3:6.0f} ms" if s < 1 else f"{s:6.2f} s "


def _command(plan: Plan, row: Row) -> str:
    sets = " ".join(f"--set {f}" for f in row.flags)
    if plan.gpus == 1:
        return f"genrl train {plan.recipe} {sets}".rstrip()
    launch = (
        f"accelerate launch --config_file genrl/launch_configs/{row.launch} "
        f"--num_processes {plan.gpus} -m genrl.cli.main train {plan.recipe} {sets}"
    ).rstrip()
    if row.strategy == "FSDP2-SGO":
        launch += "   (with fsdp_reshard_after_forward: false in the launch config)"
    return launch


def text(plan: Plan) -> str:
    """The plan as lines of at most ~110 characters."""
    counts = ", ".join(f"{k} {v / 1e9:.2f}B" for k, v in plan.parameters.items())
    b = plan.batches
    lines = [
        f"genrl plan {plan.recipe}: {plan.model} ({counts})",
        f"  step: {plan.sizes}; training forward batch {b['train']}, rollout batch {b['rollout']} "
        f"per GPU ({b['local']} samples per GPU per iteration)",
        f"  {plan.gpus} GPU(s) of {plan.gpu_memory / GIB:.0f} GiB, {plan.tflops:.0f} TFLOP/s at "
        f"MFU {plan.mfu:.2f}; fits: at most {plan.usable_memory / GIB:.0f} GiB (the rest left "
        "for the CUDA context, fragmentation and the rewards). GiB per GPU:",
        "",
        f"  {'strategy':<10} {'setup':<11} {'params':>6} {'grads':>6} {'optim':>6} {'ref':>6} "
        f"{'act':>6} {'rollout':>7} {'gather':>6} {'total':>6}  fits  {'TFLOP':>6} {'time':>9}",
    ]
    for r in plan.rows:
        m = r.memory
        lines.append(
            f"  {r.strategy:<10} {r.setup.label:<11} {_gib(m.parameters)} {_gib(m.gradients)} "
            f"{_gib(m.optimizer)} {_gib(m.reference)} {_gib(m.activations)} {_gib(m.rollout):>7} "
            f"{_gib(m.transient)} {_gib(m.total)}  {'yes ' if r.fits else 'no  '}  "
            f"{r.flops / 1e12:6.1f} {_seconds(r.seconds)}"
        )
    lines.append("")
    lines.append(
        "  act: the training minibatch's forward+backward peak; rollout: one sampling step's "
        "forward; time: one rollout step + one minibatch (FLOPs / (TFLOP/s x MFU))"
    )
    if plan.best is None and plan.smaller is None:
        lines.append(
            "  nothing fits, even at train.minibatch_size=1: more GPUs, or a lower resolution"
        )
    elif plan.best is None and plan.smaller is not None:
        r = plan.smaller
        lines.append(
            f"  nothing fits at this minibatch; estimated to fit (activations scaled to the "
            f"batch): {r.strategy}, {r.setup.label}, {r.memory.total / GIB:.1f} GiB per GPU, "
            f"{_seconds(r.seconds).strip()} per minibatch step:"
        )
        lines.append(f"    {_command(plan, r)}")
    else:
        assert plan.best is not None
        r = plan.best
        lines.append(
            f"  cheapest that fits: {r.strategy}, {r.setup.label}, {r.memory.total / GIB:.1f} GiB "
            f"per GPU, {_seconds(r.seconds).strip()} per step:"
        )
        lines.append(f"    {_command(plan, r)}")
    for note in plan.notes:
        lines.append(f"  note: {note}")
    lines.append(f"  (planned in {plan.seconds:.1f} s on fake tensors; nothing was allocated)")
    return "\n".join(lines)


def as_json(plan: Plan) -> dict[str, Any]:
    """The plan's numbers, bytes and FLOPs as integers."""
    out = asdict(plan)
    rows = [*plan.rows, plan.best, plan.smaller]
    pairs = zip(rows, [*out["rows"], out["best"], out["smaller"]], strict=True)
    for row, data in pairs:
        if row is not None and data is not None:
            data["setup"] = row.setup.label
            data["command"] = _command(plan, row)
    return out
