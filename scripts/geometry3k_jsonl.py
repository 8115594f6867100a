"""Write a hub VQA dataset (default ``hiyouga/geometry3k``, EasyR1's Geometry3K recipe) as the
JSON Lines prompts genrl reads: one row per problem, its image saved beside the file.

    python scripts/geometry3k_jsonl.py OUT_DIR            # needs the network and `datasets`
    genrl train qwen25vl_3b_geo_grpo --set prompts.dataset=OUT_DIR/train.jsonl \\
        --set prompts.eval_dataset=OUT_DIR/test.jsonl

Each problem becomes ``{"prompt": ..., "images": [...], "answer": ...}``: the problem text
without the literal ``<image>`` marker EasyR1's data carries (genrl places the image itself),
followed by EasyR1's ``math.jinja`` instruction (``<think>`` then ``\\boxed{}``).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from reward_models.math_answer import FORMAT_INSTRUCTION


def write_jsonl(
    rows: Iterable[dict[str, Any]],
    directory: Path,
    split: str,
    *,
    problem_key: str = "problem",
    answer_key: str = "answer",
    image_key: str = "images",
) -> Path:
    """Write ``directory/<split>.jsonl`` and its images under ``directory/images/<split>/``.

    ``rows`` are dataset rows with PIL images (one or a list) under ``image_key``."""
    folder = directory / "images" / split
    folder.mkdir(parents=True, exist_ok=True)
    path = directory / f"{split}.jsonl"
    with path.open("w", encoding="utf-8") as out:
        for index, row in enumerate(rows):
            images = row[image_key] if isinstance(row[image_key], list) else [row[image_key]]
            names = []
            for k, image in enumerate(images):
                name = f"images/{split}/{index}_{k}.png"
                image.convert("RGB").save(directory / name)
                names.append(name)
            problem = str(row[problem_key]).replace("<image>", "").strip()
            record = {
                "prompt": f"{problem} {FORMAT_INSTRUCTION}",
                "images": names,
                "answer": str(row[answer_key]),
            }
            out.write(json.dumps(record, ensure_ascii=False) + "\n")
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="output directory")
    parser.add_argument("--dataset", default="hiyouga/geometry3k", help="hub dataset id")
    parser.add_argument("--splits", nargs="+", default=["train", "test"])
    args = parser.parse_args()
    try:
        from datasets import load_dataset
    except ImportError:
        raise SystemExit("this script needs the `datasets` package: pip install datasets") from None
    for split in args.splits:
        path = write_jsonl(load_dataset(args.dataset, split=split), args.out, split)
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
