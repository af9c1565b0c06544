"""`python -m tune_dfrl.search`: the search command (`tune_dfrl.search.cli`)."""

from tune_dfrl.search.cli import main

main()
