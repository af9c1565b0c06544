"""Training backends as the search sees them: `base` (the `Backend` protocol, `ArmSpec`, `Milestone`, the result
names), `benchmarks` (`BenchmarkSet` and the one implementation of the aggregates), `registry` (`get_backend`,
`BACKENDS`: name -> constructor; the embedded and verl backends live in `tune_dfrl.trainers`)."""
