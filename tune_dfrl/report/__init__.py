"""The paired-CI report: `scores` (`ScoreTable` from a search's records, MLflow or a CSV run table), `analysis`
(`analyze`, `analyze_search` -> `Summary`), `schema` (`Summary`: what summary.json holds), `render` (Markdown, HTML,
figures, the terminal), `transfer` (the transfer check between two slices of a run table). The command
`python -m tune_dfrl.report` is `cli`."""
