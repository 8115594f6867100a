"""How fast the CLI answers ``genrl --help``, an argument error and a config error: the median
wall time of fresh interpreters running each, against ``python -c pass`` measured in the same
run (interleaved), so the ratio says what the CLI adds to a bare interpreter start. Target:
``help_seconds`` under 1 s.

Run ``python benchmarks/cli_startup.py`` (a few seconds) or ``--repeats 3``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

COMMANDS: dict[str, list[str]] = {
    "python -c pass": [sys.executable, "-c", "pass"],
    "genrl --help": [sys.executable, "-m", "genrl.cli.main", "--help"],
    "genrl train --help": [sys.executable, "-m", "genrl.cli.main", "train", "--help"],
    "genrl train --bogus (argument error)": [
        sys.executable,
        "-m",
        "genrl.cli.main",
        "train",
        "--bogus",
    ],
    # A config error: the recipe is built and the key checked (before torch is imported).
    "genrl train --set nope=1 (config error)": [
        sys.executable,
        "-m",
        "genrl.cli.main",
        "train",
        "--set",
        "nope=1",
    ],
}


def time_once(command: list[str], env: dict[str, str]) -> float:
    """Seconds from spawning ``command`` to its exit (its output discarded)."""
    start = time.perf_counter()
    subprocess.run(command, env=env, cwd=ROOT, capture_output=True, check=False)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=11)
    args = parser.parse_args()
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": path}
    times: dict[str, list[float]] = {name: [] for name in COMMANDS}
    names = list(COMMANDS)
    for r in range(args.repeats + 1):  # the first round warms the file cache and is dropped
        for name in names if r % 2 == 0 else names[::-1]:
            elapsed = time_once(COMMANDS[name], env)
            if r > 0:
                times[name].append(elapsed)
    medians = {name: statistics.median(values) for name, values in times.items()}
    baseline = medians["python -c pass"]
    print(f"{'command':<42} {'median s':>9} {'x python':>9}")
    for name, value in medians.items():
        print(f"{name:<42} {value:9.3f} {value / baseline:9.2f}")
    help_s = medians["genrl --help"]
    summary = {
        "benchmark": "cli_startup",
        "repeats": args.repeats,
        "help_seconds": round(help_s, 4),
        "train_help_seconds": round(medians["genrl train --help"], 4),
        "argument_error_seconds": round(medians["genrl train --bogus (argument error)"], 4),
        "config_error_seconds": round(medians["genrl train --set nope=1 (config error)"], 4),
        "python_seconds": round(baseline, 4),
        "help_over_python_ratio": round(help_s / baseline, 3),
        "target_help_seconds": 1.0,
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
