"""What the core calls on a policy (the typed protocols every adapter meets) and the weight
averages kept of it (EMA)."""
