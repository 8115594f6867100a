"""What a run makes and keeps: the batch types every rollout and objective exchange, the named
random streams, the offline rollout store and durable file writes."""
