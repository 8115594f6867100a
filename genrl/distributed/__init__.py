"""Processes and sharding: the accelerator of a run, this process's slice of the global batch,
gathers, FSDP2 on CPU processes and the DeepSpeed glue."""
