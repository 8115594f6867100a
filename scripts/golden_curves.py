"""Check or regenerate the golden curves of the embedded recipes (``tests/golden/curves.json``).

python scripts/golden_curves.py            # compare with the recorded curves
python scripts/golden_curves.py --write    # record them anew (after an intended change)
python scripts/golden_curves.py --write digits_ram   # only some recipes
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import golden_curves


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("recipes", nargs="*", help="default: every embedded recipe")
    parser.add_argument("--write", action="store_true", help="record instead of comparing")
    args = parser.parse_args(argv)
    recipes = args.recipes or list(golden_curves.RECIPES)
    recorded = golden_curves.load() if golden_curves.PATH.exists() else {}
    failed = False
    for recipe in recipes:
        started = time.perf_counter()
        with tempfile.TemporaryDirectory() as tmp:
            curve = golden_curves.run(recipe, Path(tmp))
        seconds = time.perf_counter() - started
        if args.write:
            recorded[recipe] = curve
            print(f"{recipe:<24} recorded ({seconds:.0f} s)", flush=True)
            continue
        rtol, atol = golden_curves.tolerance(recipe)
        problems = golden_curves.differences(recorded[recipe], curve, rtol=rtol, atol=atol)
        failed |= bool(problems)
        print(f"{recipe:<24} {'differs' if problems else 'matches'} ({seconds:.0f} s)")
        for line in problems:
            print(f"    {line}")
    if args.write:
        golden_curves.save(recorded)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
