"""The rubric engine: a rubric's spec, its criteria's verifiers and judges, and the aggregation
of their scores into one reward."""
