"""Planning a run before it starts: ``genrl plan`` (``plan.py``) builds a recipe's real-size
model from its config on fake tensors (``modelling.py``, the configs in ``models/``), traces one
rollout step and one training minibatch (``tracing.py``, ``workloads.py``) and spreads the
result over GPUs per strategy (``strategies.py``); ``report.py`` prints it."""
