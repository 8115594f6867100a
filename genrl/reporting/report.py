"""What a run leaves for a person: resolved config, sample grids (before, after and at every
evaluation under ``samples/``), reward curves, before/after table, ``summary.json`` (README.md,
"What a run leaves behind") and ``report.html``, which shows them all in one self-contained page."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from genrl.data.fileio import check_output_directory, naming_full_disk
from genrl.prompts.heldout import evaluated, evaluates_training_prompts, run_protocol
from genrl.reporting.curves import curve_labels, draw_curve, save_score_curves
from genrl.reporting.evaluation import EvalResult
from genrl.reporting.html import SAMPLES_DIR, ReportInputs, write_report
from genrl.reporting.metrics import MetricsWriter, read_metrics
from genrl.reporting.pictures import save_sample_grid, save_side_by_side, save_video_samples
from tasks.prompt import prompt_columns, prompt_id


class RunReport:
    """Writes the run directory's human-facing files (main process only)."""

    def __init__(self, trainer: Any, run_dir: Path) -> None:
        self.trainer = trainer
        self.run_dir = run_dir
        # Without a held-out set (a prompt file, an in-memory dataset) the evaluation runs on
        # the training prompts, and every label says so instead of "held-out".
        source = trainer.prompts
        self.on_training_prompts = evaluates_training_prompts(source.train, source.eval)

    def evaluated(self, name: str) -> str:
        """``name`` as this run's evaluation measured it: "held-out NAME" or "NAME on the
        training prompts" (``genrl/prompts/heldout.py``)."""
        return evaluated(name, self.on_training_prompts)

    def start(self, resumed: bool) -> None:
        check_output_directory(self.run_dir, "the run directory")
        self.run_dir.mkdir(parents=True, exist_ok=True)
        config = self.trainer.config.to_dict()
        with naming_full_disk(self.run_dir / "config.json"):
            (self.run_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        verb = "resuming" if resumed else "writing"
        print(f"genrl: {verb} run {self.run_dir} (recipe {self.trainer.config.recipe})", flush=True)

    def samples(
        self,
        result: EvalResult,
        stem: str,
        writer: MetricsWriter | None = None,
        step: int = 0,
        title: str | None = None,
        tag: str | None = None,
    ) -> None:
        """``<stem>.png`` (a grid) for images; ``<stem>.gif`` (the grid animated) and
        ``<stem>.png`` (a frame strip per prompt) for videos; ``<stem>.md`` (a table) for texts.
        Pictures also go to the trackers through ``writer`` (GIFs play there), the written
        file itself under ``tag`` (default ``samples/<stem>``). ``stem`` may name a subfolder
        (``samples/iter_000010``)."""
        tag = tag or f"samples/{stem}"
        if not isinstance(result.outputs, torch.Tensor):
            save_text_samples(result, self.run_dir / f"{stem}.md", self.trainer.reward.name)
            return
        png = self.run_dir / f"{stem}.png"
        num_prompts = self.trainer.config.logging.grid_prompts
        if result.outputs.ndim == 5:
            gif = self.run_dir / f"{stem}.gif"
            save_video_samples(
                result.outputs, result.prompts, gif, png, num_prompts=num_prompts, title=title
            )
            if writer is not None:
                writer.add_picture(tag, gif, step)
            return
        save_sample_grid(result.outputs, result.prompts, png, num_prompts=num_prompts, title=title)
        if writer is not None:
            writer.add_picture(tag, png, step)

    def evaluation(
        self, result: EvalResult, iteration: int, writer: MetricsWriter | None = None
    ) -> None:
        """Keep an evaluation's samples for report.html: ``samples/iter_<iteration>.png``
        (``.gif`` too for videos) or, for texts, ``.json`` with the first prompts' outputs.
        The picture, once drawn, also goes to the trackers through ``writer`` under one tag,
        ``samples/eval``, at step ``iteration``: a tracker's step slider then walks through
        every evaluation of the run."""
        stem = f"{SAMPLES_DIR}/iter_{iteration:06d}"
        (self.run_dir / SAMPLES_DIR).mkdir(parents=True, exist_ok=True)
        if isinstance(result.outputs, torch.Tensor):
            title = f"iteration {iteration}: {self.evaluated(self.trainer.reward.name)} "
            title += f"{result.reward:.3f}"
            self.samples(result, stem, writer, iteration, title=title, tag=EVAL_TAG)
            return
        rows = [
            {"prompt": p, "output": o, "prompt_reward": result.per_prompt[prompt_id(p)]}
            for p, o in list(zip(result.prompts, result.outputs, strict=True))[:TEXT_ROWS]
        ]
        path = self.run_dir / f"{stem}.json"
        with naming_full_disk(path):
            path.write_text(json.dumps(rows, indent=1) + "\n", encoding="utf-8")

    def finish(
        self,
        after: EvalResult,
        wall_seconds: float,
        writer: MetricsWriter | None = None,
        plan: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Write the end-of-run files; ``plan`` is the run's planned and measured memory
        (``genrl/loop/run_plan.py``), kept in ``summary.json`` and shown in ``report.html``."""
        t = self.trainer
        title = f"after {t.iteration} iterations: {self.evaluated(t.reward.name)} "
        title += f"{after.reward:.3f}"
        self.samples(after, "samples_after", writer, t.iteration, title=title)
        self.evaluation(after, t.iteration, writer)
        titles = ("before", "after")  # each grid's own title gives its held-out reward
        for suffix in (".png", ".gif"):
            before, after_file = (
                self.run_dir / f"samples_{w}{suffix}" for w in ("before", "after")
            )
            if before.is_file() and after_file.is_file():
                both = self.run_dir / f"samples_before_after{suffix}"
                save_side_by_side(before, after_file, both, titles)
        before = t.eval_history["before"]
        rows = read_metrics(self.run_dir / "metrics.jsonl")
        title = f"{t.config.recipe}: {t.config.algorithm.name}"
        # The parts of the reward (a rubric's criteria, a composite's terms), one curve each.
        parts = reward_parts(t.reward, list(after.scores))
        # The scores the task's results are stated in (``RewardModel.headline``).
        headlines = [n for n in getattr(t.reward, "headlines", []) if n in after.scores]
        save_score_curves(rows, parts, self.run_dir / "score_curves.png", title)
        curves = self._curves(rows, [t.reward.name, *parts][:MAX_CURVES], title)
        summary = {
            "recipe": t.config.recipe,
            "algorithm": t.config.algorithm.name,
            "heldout_reward_before": before["reward"],
            "heldout_reward_after": after.reward,
            "heldout_reward_gain": after.reward - before["reward"],
            "heldout_samples": len(after.prompts),
            "heldout_protocol": run_protocol(t),
            # "held-out prompts", or "training prompts" when there is no held-out set (the
            # heldout_* numbers were then measured on the training prompts).
            "evaluated_on": "training prompts" if self.on_training_prompts else "held-out prompts",
            "headline_scores": headlines,
            "heldout_scores_before": before["scores"],
            "heldout_scores_after": after.scores,
            "heldout_per_prompt_before": before["per_prompt"],
            "heldout_per_prompt_after": after.per_prompt,
            "iterations": t.iteration,
            "num_processes": t.accelerator.num_processes,
            "optimizer_steps": t.optimizer_steps,
            "samples_seen": t.iteration * t.num_global,
            # Every sample drawn (a policy's pilots and profiles, dynamic sampling's refills;
            # not replayed ones): the rollout cost the allocation methods compare.
            "samples_generated": t.samples_generated,
            "wall_seconds": wall_seconds,
        }
        if plan is not None:
            summary["plan"] = plan
        with naming_full_disk(self.run_dir / "summary.json"):
            (self.run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        repeats = [n for n in after.scores if n not in parts and n != t.reward.name]
        inputs = ReportInputs(title, summary, t.config.to_dict(), curves, t.reward.name, repeats)
        with naming_full_disk(self.run_dir / "report.html"):
            write_report(self.run_dir, inputs, rows)
        whole = self.run_dir / PER_PROMPT_FILE
        with naming_full_disk(whole):
            table = before_after_table(before["per_prompt"], after.per_prompt, t.reward.name)
            whole.write_text(table + "\n", encoding="utf-8")
        print(
            printed_table(before["per_prompt"], after.per_prompt, t.reward.name, whole),
            flush=True,
        )
        print(summary["heldout_protocol"], flush=True)
        changes = [
            (self.evaluated(name), before["scores"][name], after.scores[name])
            for name in headlines
            if name in before["scores"]
        ]
        changes.append((self.evaluated(t.reward.name), before["reward"], after.reward))
        print(closing_line(changes, len(after.prompts), wall_seconds, self.run_dir), flush=True)
        return summary

    def _curves(self, rows: list[dict[str, Any]], names: list[str], title: str) -> list:
        """(name, PNG) per score; the total's is also ``reward_curve.png``. Each band is clipped
        to its reward's declared range (``RewardModel.score_range``)."""
        reward = self.trainer.reward
        ranges = {reward.name: getattr(reward, "score_range", None)}
        for member, _ in getattr(reward, "rewards", []):
            ranges[member.name] = member.score_range
        train_label, eval_label = curve_labels(self.trainer.config, self.on_training_prompts)
        curves = []
        for name in names:
            path = self.run_dir / "reward_curve.png" if name == reward.name else None
            png = draw_curve(
                rows,
                name,
                title if name == reward.name else f"{title}: {name}",
                # "training reward (...)" reads "training accuracy (...)" on a part's curve.
                train_label=train_label.replace("reward", name, 1),
                eval_label=eval_label.replace("reward", name, 1),
                score_range=ranges.get(name),
                path=path,
            )
            curves.append((name, png))
        return curves


TEXT_ROWS = 12  # a text evaluation's rows kept for report.html
PRINTED_PROMPTS = 10  # per-prompt rows printed at the end of a run; PER_PROMPT_FILE has them all
PER_PROMPT_FILE = "per_prompt.txt"
EVAL_TAG = "samples/eval"  # the trackers' tag of every evaluation's grid, stepped by iteration
MAX_CURVES = 12  # curves in report.html: the total reward and its first parts


def save_text_samples(result: EvalResult, path: Path, name: str, limit: int = 50) -> None:
    """The first ``limit`` held-out texts with their prompts, as a Markdown table. When the
    shown prompts carry images (a VLM's ``images`` column), each prompt's images are saved as
    PNGs under ``<run>/samples_images/`` and shown in a first ``image`` column."""
    rows = list(zip(result.prompts, result.outputs, strict=True))[:limit]
    with_images = any(prompt_columns(prompt).get("images") for prompt, _ in rows)
    lines = [f"| prompt | output | mean {name} of the prompt |", "|---|---|---|"]
    if with_images:
        lines = [f"| image {lines[0]}", f"|---{lines[1]}"]
    saved: dict[str, str] = {}
    for prompt, text in rows:
        cells = [c.replace("|", "\\|").replace("\n", " ") for c in (prompt, text)]
        line = f"| {cells[0]} | {cells[1]} | {result.per_prompt[prompt_id(prompt)]:.3f} |"
        if with_images:
            if prompt_id(prompt) not in saved:
                saved[prompt_id(prompt)] = _save_prompt_images(prompt, path, len(saved))
            line = f"| {saved[prompt_id(prompt)]} {line}"
        lines.append(line)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def _save_prompt_images(prompt: str, table: Path, index: int) -> str:
    """Save a prompt's images (PIL images or paths) as ``samples_images/<table stem>_<index>_<k>
    .png`` next to ``table``; the Markdown that shows them (empty when it has none)."""
    from PIL import Image

    images = prompt_columns(prompt).get("images") or []
    images = list(images) if isinstance(images, list | tuple) else [images]
    folder = table.parent / "samples_images"
    links = []
    for k, image in enumerate(images):
        if isinstance(image, str | Path):
            with Image.open(image) as opened:
                image = opened.convert("RGB")
        folder.mkdir(parents=True, exist_ok=True)
        name = f"{table.stem}_{index}_{k}.png"
        image.save(folder / name)
        links.append(f"![image {k}](samples_images/{name})")
    return " ".join(links)


def reward_parts(reward: Any, names: list[str]) -> list[str]:
    """The score names of ``names`` drawn as the reward's parts, besides the total: a lone
    member's primary score is left out, since the total is that score times its weight (its
    curve drew the total's twice in report.html)."""
    members = getattr(reward, "rewards", [])
    alone = {members[0][0].name} if len(members) == 1 else set()
    return [name for name in names if name != reward.name and name not in alone]


def closing_line(
    changes: list[tuple[str, float, float]], samples: int, wall_seconds: float, run_dir: Path
) -> str:
    """The last line of a run: ``(label, before, after)`` per number (the task's headline
    scores first, then the reward), the samples, the time and where the outputs are."""
    shown = "; ".join(f"{label}: {b:.3f} -> {a:.3f} ({a - b:+.3f})" for label, b, a in changes)
    return f"{shown} on {samples} samples; {wall_seconds:.0f} s; outputs in {run_dir}"


def printed_table(
    before: dict[str, float],
    after: dict[str, float],
    name: str,
    whole: Path,
    limit: int = PRINTED_PROMPTS,
) -> str:
    """The before/after table as printed: every prompt up to ``limit`` of them; beyond, the
    ``limit // 2`` largest rises and the ``limit - limit // 2`` largest falls (the mean row
    still over every prompt), under a line naming ``whole``, the file with every prompt. The
    VLM task's 1,000 rows scrolled the closing lines away."""
    if len(before) <= limit:
        return before_after_table(before, after, name)
    by_change = sorted(before, key=lambda p: after.get(p, float("nan")) - before[p], reverse=True)
    rises = limit // 2
    shown = by_change[:rises] + by_change[len(by_change) - (limit - rises) :]
    note = (
        f"{limit} of {len(before)} prompts (the {rises} largest rises, the {limit - rises} "
        f"largest falls); every prompt: {whole}"
    )
    return note + "\n" + before_after_table(before, after, name, rows=shown)


def before_after_table(
    before: dict[str, float], after: dict[str, float], name: str, rows: list[str] | None = None
) -> str:
    """Each prompt's mean reward before and after training, and its change; ``rows`` picks
    the prompts shown (default: all), the last line is the mean over every prompt."""
    shown = list(before) if rows is None else rows
    width = max(len("prompt"), *(len(p) for p in shown))
    lines = [f"{'prompt':<{width}}  {'before':>7}  {'after':>7}  {'change':>7}"]
    lines.append("-" * len(lines[0]))
    for prompt in shown:
        b = before[prompt]
        a = after.get(prompt, float("nan"))
        lines.append(f"{prompt:<{width}}  {b:7.3f}  {a:7.3f}  {a - b:+7.3f}")
    mean_b = sum(before.values()) / len(before)
    mean_a = sum(after.values()) / len(after)
    lines.append("-" * len(lines[0]))
    lines.append(
        f"{'mean ' + name:<{width}}  {mean_b:7.3f}  {mean_a:7.3f}  {mean_a - mean_b:+7.3f}"
    )
    return "\n".join(lines)
