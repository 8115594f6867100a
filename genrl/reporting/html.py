"""``report.html``: one self-contained page per run (config, curves per reward, sample grids
over training, per-prompt table), viewable offline: every picture is a base64 data URI and
there are no scripts, styles or fonts from elsewhere.

Sections carry ids (``summary``, ``curves``, ``samples``, ``per-prompt``, ``config``, and
``plan`` in a run that planned itself, ``logging.plan``) so that a test can find them in the page
as a browser renders it.
"""

from __future__ import annotations

import base64
import html
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from genrl.prompts.heldout import evaluated

SECTIONS = ("summary", "curves", "samples", "per-prompt", "config")
SAMPLES_DIR = "samples"  # <run>/samples/iter_<iteration>.png|.gif|.json, one per evaluation
_ITERATION = re.compile(r"iter_(\d+)\.(png|gif|json)$")

_STYLE = """
body { font-family: sans-serif; margin: 2em auto; max-width: 70em; color: #222; }
h1 { font-size: 1.5em; } h2 { border-bottom: 1px solid #ccc; padding-bottom: .2em; }
table { border-collapse: collapse; margin: .5em 0 1em; }
td, th { border: 1px solid #ccc; padding: .25em .6em; text-align: left; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
figure { display: inline-block; margin: 0 1em 1em 0; vertical-align: top; }
figcaption { font-size: .9em; color: #555; }
pre { background: #f6f6f6; padding: 1em; overflow-x: auto; font-size: .85em; }
.up { color: #1a7f37; } .down { color: #cf222e; }
"""


@dataclass
class ReportInputs:
    """What the page shows, gathered by ``RunReport.finish``.

    Attributes:
        title: the page's heading (recipe and algorithm).
        summary: the dict written to ``summary.json``.
        config: the resolved config (``config.json``).
        curves: (score name, PNG bytes) per drawn curve, the total reward first.
        reward_name: the primary reward's name, for the per-prompt table's heading.
        repeats: scores left out of the summary table because they repeat the reward (a lone
            member's primary score, ``report.reward_parts``).
    """

    title: str
    summary: dict[str, Any]
    config: dict[str, Any]
    curves: list[tuple[str, bytes]] = field(default_factory=list)
    reward_name: str = "reward"
    repeats: list[str] = field(default_factory=list)


def data_uri(data: bytes, mime: str) -> str:
    """``data`` inlined as a ``data:`` URI, so the page needs no other file."""
    return f"data:{mime};base64,{base64.b64encode(data).decode('ascii')}"


def evaluation_files(run_dir: Path) -> list[tuple[int, Path]]:
    """The saved evaluations under ``<run>/samples`` as (iteration, file), in training order;
    a GIF is preferred to the frame-strip PNG of the same evaluation."""
    found: dict[int, Path] = {}
    folder = run_dir / SAMPLES_DIR
    if not folder.is_dir():
        return []
    for path in sorted(folder.iterdir()):
        match = _ITERATION.match(path.name)
        if match is None:
            continue
        iteration = int(match.group(1))
        if iteration not in found or path.suffix == ".gif":
            found[iteration] = path
    return sorted(found.items())


def write_report(run_dir: Path, inputs: ReportInputs, rows: list[dict[str, Any]]) -> Path:
    """Write ``<run>/report.html`` and return its path. ``rows`` are ``metrics.jsonl``'s, for
    the held-out reward of each evaluation shown."""
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{html.escape(inputs.title)}</title><style>{_STYLE}</style></head><body>",
        f"<h1>{html.escape(inputs.title)}</h1>",
        _summary_section(inputs.summary, {inputs.reward_name, *inputs.repeats}),
        _curves_section(inputs.curves),
        _samples_section(run_dir, rows, _on_training_prompts(inputs.summary)),
        _per_prompt_section(inputs.summary, inputs.reward_name),
        _plan_section(inputs.summary.get("plan")),
        _config_section(inputs.config),
        "</body></html>",
    ]
    path = run_dir / "report.html"
    path.write_text("\n".join(parts) + "\n", encoding="utf-8")
    return path


PLAN_PARTS = ("parameters", "gradients", "optimizer", "reference", "activations", "rollout",
              "transient", "total")  # fmt: skip


def _plan_section(plan: dict[str, Any] | None) -> str:
    """The run's planned memory per GPU by part and, on CUDA, the measured peak beside it
    (``logging.plan``); empty when the run made no plan."""
    if not plan or not plan.get("made"):
        return ""
    gib = 2**30
    planned = plan["planned_bytes"]
    rows = [f'<tr><th>{p}</th><td class="num">{planned[p] / gib:.3f}</td></tr>' for p in PLAN_PARTS]
    peak = plan.get("measured_peak_bytes")
    if peak is None:
        rows.append(f"<tr><th>measured peak</th><td>{html.escape(plan['measured_why'])}</td></tr>")
    else:
        rows.append(
            f'<tr><th>measured peak</th><td class="num">{peak / gib:.3f} '
            f"({plan['measured_over_planned']:.2f} x the plan)</td></tr>"
        )
    head = (
        f"<p>{html.escape(plan['model'])}; {html.escape(plan['sizes'])}; {plan['strategy']} on "
        f"{plan['processes']} process(es), {html.escape(plan['setup'])}. GiB per GPU "
        "(<code>genrl plan</code>'s parts; the total is the peak of the rollout, training and "
        "optimizer phases, not the sum):</p>"
    )
    notes = "".join(f"<li>{html.escape(n)}</li>" for n in plan.get("notes", []))
    body = f"{head}<table>{''.join(rows)}</table><ul>{notes}</ul>"
    return _section("plan", "Planned and measured memory", body)


def _section(name: str, heading: str, body: str) -> str:
    return f'<section id="{name}"><h2>{html.escape(heading)}</h2>\n{body}\n</section>'


def _number(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return html.escape(str(value))


def _on_training_prompts(summary: dict[str, Any]) -> bool:
    """Whether the run evaluated on its training prompts (no held-out set; ``evaluated_on``)."""
    return summary.get("evaluated_on") == "training prompts"


def _change(before: float, after: float) -> str:
    change = after - before
    css = "up" if change > 0 else "down" if change < 0 else ""
    return f'{before:.4f} &rarr; {after:.4f} (<span class="{css}">{change:+.4f}</span>)'


def _summary_section(summary: dict[str, Any], shown_above: set[str]) -> str:
    before, after = summary.get("heldout_reward_before"), summary.get("heldout_reward_after")
    on_training = _on_training_prompts(summary)
    keys = ("recipe", "algorithm", "iterations", "optimizer_steps", "samples_seen",
            "heldout_samples", "num_processes", "wall_seconds")  # fmt: skip
    rows = [f"<tr><th>{k}</th><td>{_number(summary[k])}</td></tr>" for k in keys if k in summary]
    scores_before = summary.get("heldout_scores_before") or {}
    scores = summary.get("heldout_scores_after") or {}
    # The task's headline scores first, then the reward, then every other score.
    headlines = [n for n in summary.get("headline_scores", []) if n in scores]
    top = [
        f"<tr><th>{html.escape(evaluated(n, on_training))}</th>"
        f"<td>{_change(scores_before[n], scores[n])}</td></tr>"
        for n in headlines
        if n in scores_before
    ]
    if before is not None and after is not None:
        label = html.escape(evaluated("reward", on_training))
        top.append(f"<tr><th>{label}</th><td>{_change(before, after)}</td></tr>")
    rows = top + rows
    for name, value in scores.items():
        if name in shown_above or name in headlines:  # the rows above
            continue
        old = scores_before.get(name)
        shown = f"{old:.4f} &rarr; {value:.4f}" if old is not None else f"{value:.4f}"
        label = html.escape(evaluated(name, on_training))
        rows.append(f"<tr><th>{label}</th><td>{shown}</td></tr>")
    return _section("summary", "Summary", f"<table>{''.join(rows)}</table>{_protocol(summary)}")


def _protocol(summary: dict[str, Any]) -> str:
    """The run's held-out protocol (``genrl/prompts/heldout.py``) as a paragraph; none in an older
    summary without one."""
    line = summary.get("heldout_protocol")
    return f'<p class="protocol">{html.escape(line)}</p>' if line else ""


def _curves_section(curves: list[tuple[str, bytes]]) -> str:
    figures = [
        f'<figure><img alt="{html.escape(name)} curve" src="{data_uri(png, "image/png")}">'
        f"<figcaption>{html.escape(name)}</figcaption></figure>"
        for name, png in curves
    ]
    body = "".join(figures) or "<p>No iteration was logged.</p>"
    note = (
        "<p>Training mean per iteration with a band of one standard deviation (clipped to the "
        "reward's range), held-out evaluations as points.</p>"
    )
    return _section("curves", "Reward curves", note + body)


def _held_out_by_iteration(rows: list[dict[str, Any]]) -> dict[int, float]:
    return {r["iteration"]: r["eval/reward"] for r in rows if r.get("eval/reward") is not None}


def _samples_section(run_dir: Path, rows: list[dict[str, Any]], on_training: bool) -> str:
    held_out = _held_out_by_iteration(rows)
    label = evaluated("reward", on_training)
    blocks = []
    for iteration, path in evaluation_files(run_dir):
        reward = held_out.get(iteration)
        caption = f"iteration {iteration}" + (
            f": {label} {reward:.4f}" if reward is not None else ""
        )
        if path.suffix == ".json":
            blocks.append(f"<h3>{html.escape(caption)}</h3>{_text_table(path)}")
            continue
        mime = "image/gif" if path.suffix == ".gif" else "image/png"
        uri = data_uri(path.read_bytes(), mime)
        blocks.append(
            f'<figure><img alt="samples at {html.escape(caption)}" src="{uri}">'
            f"<figcaption>{html.escape(caption)}</figcaption></figure>"
        )
    body = "".join(blocks) or "<p>No evaluation was saved.</p>"
    which = "Samples of the training prompts" if on_training else "Held-out samples"
    note = f"<p>{which} (fixed prompts and seeds) at every evaluation.</p>"
    return _section("samples", "Samples over training", note + body)


def _text_table(path: Path) -> str:
    rows = json.loads(path.read_text(encoding="utf-8"))
    cells = "".join(
        f"<tr><td>{html.escape(r['prompt'])}</td><td>{html.escape(r['output'])}</td>"
        f'<td class="num">{r["prompt_reward"]:.3f}</td></tr>'
        for r in rows
    )
    return (
        "<table><tr><th>prompt</th><th>output</th><th>prompt's mean reward</th></tr>"
        f"{cells}</table>"
    )


def _per_prompt_section(summary: dict[str, Any], reward_name: str) -> str:
    before = summary.get("heldout_per_prompt_before") or {}
    after = summary.get("heldout_per_prompt_after") or {}
    lines = []
    for prompt, b in before.items():
        a = after.get(prompt)
        change = "" if a is None else f"{a - b:+.3f}"
        shown_a = "" if a is None else f"{a:.3f}"
        lines.append(
            f"<tr><td>{html.escape(prompt)}</td><td class='num'>{b:.3f}</td>"
            f"<td class='num'>{shown_a}</td><td class='num'>{change}</td></tr>"
        )
    head = (
        f"<tr><th>prompt</th><th>{html.escape(reward_name)} before</th><th>after</th>"
        "<th>change</th></tr>"
    )
    body = f"<table>{head}{''.join(lines)}</table>" if lines else "<p>No held-out prompts.</p>"
    heading = "Per prompt (" + evaluated("mean", _on_training_prompts(summary)) + ")"
    return _section("per-prompt", heading, _protocol(summary) + body)


def _config_section(config: dict[str, Any]) -> str:
    text = html.escape(json.dumps(config, indent=2))
    return _section("config", "Config", f"<pre>{text}</pre>")
