"""What a run shows a person: held-out evaluation, ``metrics.jsonl`` and the experiment
trackers, sample grids and curves, the run directory's files and ``report.html``."""
