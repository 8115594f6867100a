"""The repository stands alone: it cites only its own files and the papers.

1. No text file names a document that lives outside the repository (design or reference notes,
   a ``shared`` folder beside the checkout) or an absolute path on a build machine.
2. Every project path written in backticks in README.md and docs/ names a file or folder that
   exists, so a doc does not point at a file's old home after a move.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SELF = Path(__file__).resolve().relative_to(ROOT).as_posix()

TEXT_SUFFIXES = (".py", ".md", ".toml", ".txt", ".yaml", ".yml", ".cfg")
TEXT_FILES = (".ci/run",)

# Built from pieces so that this file does not match itself.
_MD = "." + "md"
FORBIDDEN = re.compile(
    "|".join(
        [
            re.escape("DESIGN" + _MD),
            re.escape("REFERENCE" + _MD),
            re.escape(".." + "/" + "shared"),
            # "shared" as a path component: ``shared/...``, ``../shared/...``, ``x/shared/...``
            r"(?<![\w.-])" + "sha" + r"red/",
            # absolute machine paths
            r"(?<![\w.~-])/(?:" + "|".join(["wo" + "rk", "t" + "mp", "ro" + "ot"]) + r")/",
        ]
    )
)

TOP_FOLDERS = (
    "genrl",
    "pipelines",
    "reward_models",
    "samplers",
    "loading",
    "tasks",
    "tests",
    "benchmarks",
    "scripts",
    "docs",
)
FILE_SUFFIXES = (
    "py",
    "md",
    "png",
    "gif",
    "json",
    "jsonl",
    "yaml",
    "yml",
    "txt",
    "toml",
    "csv",
    "html",
    "safetensors",
)
PROJECT_PATH = re.compile(
    r"(?:"
    + "|".join(TOP_FOLDERS)
    + r")/(?:[\w.-]+/)*(?:[\w.-]+\.(?:"
    + "|".join(FILE_SUFFIXES)
    + r")|)"
)
SUFFIX = re.compile(r"(?:::[\w\[\]-]+|:\d+(?:-\d+)?)$")  # ``file.py::test_x``, ``file.py:12``
# Paths in other projects' repositories that the docs cite (they are not ours to check).
OTHER_REPOSITORIES = {
    "scripts/train_sd3.py": "yifan123/flow_grpo",
    "scripts/train_sd3_GRPO_Guard.py": "yifan123/flow_grpo",
    "scripts/train_nft_sd3.py": "NVlabs/DiffusionNFT",
    "scripts/train_sd3_dgpo.py": "Luo-Yihong/DGPO",
    "scripts/train_sd3_awm.py": "scxue/advantage_weighted_matching",
    "docs/source/grpo_trainer.md": "huggingface/trl",
}
FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
CODE_SPAN = re.compile(r"(`+)(.+?)\1", re.S)


def _listed_files() -> list[str]:
    """Tracked files, and untracked ones that are not ignored (what the next commit may add)."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: cannot list the repository's files")
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.decode("utf-8")
    return sorted({p for p in out.split("\0") if p and (ROOT / p).is_file()})


def _is_text_file(path: str) -> bool:
    return path.endswith(TEXT_SUFFIXES) or path in TEXT_FILES


def test_no_file_cites_documents_outside_the_repository() -> None:
    bad = []
    for path in _listed_files():
        if not _is_text_file(path) or path == SELF:
            continue
        text = (ROOT / path).read_text(encoding="utf-8", errors="replace")
        for number, line in enumerate(text.splitlines(), start=1):
            if FORBIDDEN.search(line):
                bad.append(f"{path}:{number}: {line.strip()}")
    assert not bad, "references to files outside the repository:\n" + "\n".join(bad)


def _backticked_paths(text: str) -> list[tuple[int, str]]:
    """``(line, path)`` of each inline code span that is a project path (fenced blocks aside)."""
    text = FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    found = []
    for match in CODE_SPAN.finditer(text):
        span = match.group(2).strip()
        if any(mark in span for mark in ("*", "<", "{", "...")) or re.search(r"\s", span):
            continue
        span = SUFFIX.sub("", span)
        if PROJECT_PATH.fullmatch(span) and (span.endswith("/") or "." in span.rsplit("/", 1)[1]):
            found.append((text.count("\n", 0, match.start()) + 1, span))
    return found


def test_backticked_paths_in_the_docs_exist() -> None:
    files = _listed_files()
    folders = {p.rsplit("/", i)[0] + "/" for p in files for i in range(1, p.count("/") + 1)}
    docs = [p for p in files if p == "README.md" or (p.startswith("docs/") and p.endswith(".md"))]
    assert "README.md" in docs
    missing = []
    for doc in docs:
        text = (ROOT / doc).read_text(encoding="utf-8")
        for number, path in _backticked_paths(text):
            exists = path in folders if path.endswith("/") else path in files
            if not exists and path not in OTHER_REPOSITORIES:
                missing.append(f"{doc}:{number}: `{path}`")
    assert not missing, "paths in the docs that do not exist:\n" + "\n".join(missing)


def test_the_checks_catch_what_they_should() -> None:
    """The patterns themselves, on made-up lines."""
    flagged = [
        "see " + "DESIGN" + _MD + " section 2",
        "as quoted in `" + "/" + "work/notes.txt`",
        "(../" + "shared/x)",
        "open('" + "/" + "tmp/x')",
    ]
    passed = ["train.offline_store=store", "runs/tmp/x", "an unshared/state", "~/work/x"]
    assert all(FORBIDDEN.search(line) for line in flagged)
    assert not any(FORBIDDEN.search(line) for line in passed)
    text = (
        "`genrl/loop/trainer.py` `tests/test_rng.py::test_x` `trainer.py` `genrl/assets/`\n"
        "`docs/algorithms/<name>.md` `genrl train x` `genrl.loop` `samplers/*.py`\n"
        "```\n`pipelines/gone.py`\n```\n`reward_models/base.py:12`\n"
    )
    assert _backticked_paths(text) == [
        (1, "genrl/loop/trainer.py"),
        (1, "tests/test_rng.py"),
        (1, "genrl/assets/"),
        (6, "reward_models/base.py"),
    ]
