"""tune_dfrl: Ray Tune-driven search service for RLVR data policies.

One subpackage per concept, lowest layer first (an import goes only down this list; `tests/test_layers.py` checks):
`errors` (every exception), `config` (constraints, typed settings, the cache folder), `backends` (the backend
contract, benchmarks and aggregates, the registry), `paired` (the pure paired-seed statistics and decision rules),
`state` (the search's files: records, event log, resume, control cache), `report` (analysis, summary schema,
rendering), `tracking` (MLflow writer and reader), `cluster` (private Ray nodes and their watches), `tune` (the Ray
Tune adapters: searcher, scheduler, trial, callbacks), `search` (plan, run, finish). The commands
`python -m tune_dfrl.search` and `python -m tune_dfrl.report` sit above them all. `policies`, `trainers` and
`search_spaces` install here from their own top-level folders.
"""
