"""`python -m tune_dfrl.report`: the report command (`tune_dfrl.report.cli`)."""

from tune_dfrl.report.cli import main

main()
