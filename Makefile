# Two commands a new user needs (Python 3.11, no GPU), and the quick loop while editing:
#   make demo   set up .venv and run the main job (a difffilter_band search on the embedded CPU backend)
#   make test   set up .venv, lint and format-check (ruff), run the test suite (three test modules at a time)
#   make check  lint and format-check, then every test that starts no Ray cluster, verl or search (those marked
#               `integration` are left out): two workers, about two minutes on two idle cores; make test is what CI runs
PYTHON ?= python3.11
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
SPACE  ?= difffilter_band
ARGS   ?=

.PHONY: setup demo test check
setup: $(STAMP)

# torch==2.13.0 goes in first: resolved as a dependency of verl it would pull a multi-GB CUDA build.
$(STAMP): pyproject.toml setup.py constraints/cpu.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -c constraints/cpu.txt -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/python -m tune_dfrl.search space=$(SPACE) $(ARGS)

# Three pytest workers on two cores: part of many tests' time is waiting on processes (Ray noticing a lost node or
# trial, a search's stall limit, signals, verl's start-up beside another trial), when a third module uses the cores.
test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python -m pytest -n 3 --dist loadfile --no-loadscope-reorder $(ARGS)

# The tests marked `integration` (pyproject.toml's markers) are left out; two workers, a module's tests on one.
check: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python -m pytest -m "not integration" -n 2 --dist loadfile $(ARGS)
