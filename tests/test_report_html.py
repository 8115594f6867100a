"""report.html: built from a real tiny run, self-contained, and whole in headless Chromium."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from tiny import tiny_config

from genrl import Trainer
from genrl.reporting.html import SECTIONS, ReportInputs, evaluation_files, write_report

CHROMIUM = next(
    (found for name in ("chromium", "chromium-browser", "google-chrome")
     if (found := shutil.which(name))),
    None,
)  # fmt: skip


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three iterations of the digits task on tiny random models, evaluated every iteration."""
    directory = tmp_path_factory.mktemp("report")
    config = tiny_config(directory, "eval.every=1", "train.iterations=3")
    Trainer(config, run_dir=directory / "run").train()
    return directory / "run"


def test_every_evaluation_keeps_its_grid(run: Path) -> None:
    grids = sorted(p.name for p in (run / "samples").iterdir())
    # Before training, after iterations 1 and 2 (eval.every=1), and the final evaluation.
    assert grids == [f"iter_{i:06d}.png" for i in range(4)]


def test_report_is_self_contained(run: Path) -> None:
    page = (run / "report.html").read_text(encoding="utf-8")
    for name in SECTIONS:
        assert f'<section id="{name}">' in page
    sources = re.findall(r'(?:src|href)="([^"]*)"', page)
    assert sources and all(s.startswith("data:image/") for s in sources)
    # 4 sample grids + curves of the total reward and the classifier's accuracy: the
    # classifier's own score is the total (its only member), so no second curve repeats it.
    assert len(sources) == 4 + 2
    curves = page[page.index('<section id="curves">') : page.index('<section id="samples">')]
    captions = re.findall(r"<figcaption>([^<]*)</figcaption>", curves)
    assert captions == ["reward", "digit_classifier/accuracy"]
    summary = json.loads((run / "summary.json").read_text())
    for prompt in summary["heldout_per_prompt_after"]:
        assert f"<td>{prompt}</td>" in page


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium binary (apt-get install chromium)")
def test_report_renders_in_headless_chromium(run: Path, tmp_path: Path) -> None:
    assert CHROMIUM is not None
    done = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--no-first-run", f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom",
         (run / "report.html").as_uri()],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    dom = done.stdout
    for name in SECTIONS:
        assert re.search(rf'<section id="{name}"', dom), name
    assert len(re.findall(r'<img [^>]*src="data:image/png;base64,', dom)) == 6
    assert "digits_flow_grpo: flow_grpo" in dom


def test_text_evaluations_become_tables(tmp_path: Path) -> None:
    (tmp_path / "samples").mkdir()
    rows = [{"prompt": "3 4 -> 7?", "output": "3+4 <end>", "prompt_reward": 1.0}]
    (tmp_path / "samples" / "iter_000000.json").write_text(json.dumps(rows))
    summary = {
        "recipe": "r",
        "heldout_reward_before": 0.25,
        "heldout_reward_after": 0.75,
        "heldout_per_prompt_before": {"3 4 -> 7?": 0.25},
        "heldout_per_prompt_after": {"3 4 -> 7?": 0.75},
        "heldout_protocol": "held-out prompts: 1 problem <of the split>; seed protocol: ...",
    }
    inputs = ReportInputs("r: grpo", summary, {"seed": 0}, [], "countdown")
    metrics = [{"iteration": 0, "eval/reward": 0.25}]
    page = write_report(tmp_path, inputs, metrics).read_text(encoding="utf-8")
    assert "<td>3 4 -&gt; 7?</td><td>3+4 &lt;end&gt;</td>" in page  # escaped, whole
    assert "iteration 0: held-out reward 0.2500" in page
    assert "0.2500 &rarr; 0.7500" in page and "+0.5000" in page
    protocol = '<p class="protocol">held-out prompts: 1 problem &lt;of the split&gt;; seed'
    assert page.count(protocol) == 2  # under the summary and above the per-prompt table
    assert "<td class='num'>0.250</td><td class='num'>0.750</td><td class='num'>+0.500</td>" in page


def test_video_evaluations_show_their_gifs(tmp_path: Path) -> None:
    folder = tmp_path / "samples"
    folder.mkdir()
    for name in ("iter_000010.png", "iter_000010.gif", "iter_000000.png", "iter_000000.gif",
                 "notes.txt"):  # fmt: skip
        (folder / name).write_bytes(b"x")
    found = [(i, p.name) for i, p in evaluation_files(tmp_path)]
    assert found == [(0, "iter_000000.gif"), (10, "iter_000010.gif")]
