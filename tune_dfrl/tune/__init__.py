"""The Ray Tune adapters: `searcher` (`PairedRepeater`: arms x the same seeds, Optuna told paired deltas),
`scheduler` (`PairedScheduler`, glue of `tune_dfrl.paired.rungs`), `trial` (`run_cell`: one (arm, seed) on a
backend), `spaces` (named search spaces, `ArmFactory`), the driver's callbacks `results_log` (`ResultsLog`),
`progress` (`Progress`) and `guarded` (`Guarded`), and `trial_watch` (`TrialWatch`: every trial end is booked)."""
