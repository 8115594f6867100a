"""A run's whole config (``TrainConfig``, its ``config.json``) and how a run is built from it:
policy, rewards, algorithm, optimizer and the accelerator's preparation (``build_run``)."""
