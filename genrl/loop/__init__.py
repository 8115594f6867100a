"""The training loop, phase by phase: the trainer (``Trainer``), phases 1-4 (prompts, rollout,
rewards, advantages: ``collection.py``, with ``reward_overlap.py``, ``allocation.py`` and
``offline.py``), phase 5 (``optimization.py``) and Ctrl-C handling."""
