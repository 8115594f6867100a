"""Write the tables of ``docs/will_it_fit.md`` by running ``genrl plan`` (``genrl.planning``) on
the shipped real-model recipes, on 1, 2, 4 and 8 GPUs of 80 GB.

python scripts/will_it_fit.py > tables.md                 # every recipe below
python scripts/will_it_fit.py sd35m_pickscore             # some of them
"""

from __future__ import annotations

import argparse
import sys
import time

RECIPES = (
    "sd35m_pickscore",
    "flux_dev_pickscore",
    "qwenimage_pickscore",
    "wan21_1_3b_flow_grpo",
    "wan21_14b_flow_grpo",
    "qwen3_countdown_grpo",
    "llada8b_countdown_maskgrpo",
    "qwen25vl_7b_geo_grpo",
)
GPU_COUNTS = [1, 2, 4, 8]
GIB = 2**30


def _gib(n: int) -> str:
    return f"{n / GIB:.1f}"


def tables(recipe: str) -> str:
    from genrl.planning.modelling import parse_memory
    from genrl.planning.plan import plans
    from genrl.recipes import get_recipe

    config = get_recipe(recipe)
    config.validate()
    started = time.perf_counter()
    results = plans(config, GPU_COUNTS, parse_memory("80GB"))
    first = results[0]
    counts = ", ".join(f"{k} {v / 1e9:.2f}B" for k, v in first.parameters.items() if v)
    lines = [
        f"### `{recipe}`: {first.model}",
        "",
        f"{counts}; {first.sizes}; training forward batch {first.batches['train']} per GPU. "
        f"Planned in {time.perf_counter() - started:.0f} s.",
        "",
        "| GPUs | cheapest that fits | GiB per GPU | step | launch config and flags |",
        "|---|---|---|---|---|",
    ]
    for plan in results:
        row, estimated = plan.best, ""
        if row is None and plan.smaller is not None:
            row, estimated = plan.smaller, " (estimated at a smaller minibatch)"
        if row is None:
            lines.append(f"| {plan.gpus} | nothing fits | | | |")
            continue
        launch = row.launch or "one process"
        if row.strategy == "FSDP2-SGO":
            launch += " with fsdp_reshard_after_forward: false"
        how = " ".join([launch, *(f"--set {f}" for f in row.flags)])
        lines.append(
            f"| {plan.gpus} | {row.strategy}, {row.setup.label}{estimated} | "
            f"{_gib(row.memory.total)} | {row.seconds:.2f} s | `{how}` |"
        )
    eight = results[-1]
    names = list(dict.fromkeys(r.strategy for r in eight.rows))
    lines += [
        "",
        "GiB per GPU on 8 GPUs (a star: fits in the 72 GiB left after the 10% reserve):",
        "",
        "| setup | " + " | ".join(names) + " | step |",
        "|---|" + "---|" * len(names) + "---|",
    ]
    for label in dict.fromkeys(r.setup.label for r in eight.rows):
        cells = [r for r in eight.rows if r.setup.label == label]
        shown = [f"{_gib(r.memory.total)}{'*' if r.fits else ''}" for r in cells]
        lines.append(f"| {label} | " + " | ".join(shown) + f" | {cells[0].seconds:.2f} s |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("recipes", nargs="*", default=list(RECIPES))
    args = parser.parse_args()
    for recipe in args.recipes:
        print(tables(recipe), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
