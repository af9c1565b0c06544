"""Paired-seed statistics and the decisions made from them: pure (numpy/scipy), no Ray, no Optuna, no files.

`stats` (paired intervals, BCa, sign-flip tests, Holm, TOST, power), `ledger` (`PairedLedger`: paired scores with
one duplicate rule, and the one paired-delta estimate), `rungs` (`decide`, `RungBook`: the paired scheduler's rule),
`feedback` (`OptunaFeedback`: what Optuna is told), `sequential` (group-sequential looks of `seeds=auto`),
`seed_batches` (`SeedBatches`: which seeds each arm gets next), `transfer` (`transfer_check`: does a proxy's
ranking of the arms predict the target's)."""
