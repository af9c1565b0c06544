"""EmbeddedBackend contract and bad input: each a clear error before any training starts."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import pytest
from fresh_interpreter import imported

from tune_dfrl.backends.base import ArmSpec, Backend
from tune_dfrl.policies import registry, scorers
from tune_dfrl.trainers.embedded import EmbeddedBackend, EmbeddedRecipe

BASELINE = ArmSpec("baseline", {}, "baseline", "baseline")


def _refused(arm: ArmSpec, recipe: dict, tmp_path: Path, match: str) -> None:
    """Building the backend or its run_trial raises ValueError(match) without reporting, checkpointing or building anything."""
    reported = []
    cache = tmp_path / "cache"
    with pytest.raises(ValueError, match=match):
        EmbeddedBackend({"cache_dir": str(cache), **recipe}).run_trial(arm, 0, reported.append, tmp_path / "ckpt")
    assert reported == [] and not (tmp_path / "ckpt").exists() and not cache.exists()


def test_the_search_driver_builds_the_backend_without_importing_transformers_models_or_verl():
    """The driver reads the recipe, validates arms and checks the base model; only trials train. transformers'
    model classes and verl's loss functions (which import them) are seconds of imports per search."""
    driver = (
        "import tune_dfrl.search; from tune_dfrl.backends.base import ArmSpec;"
        "from tune_dfrl.backends.registry import get_backend; backend = get_backend('embedded', {});"
        "backend.validate(ArmSpec('difffilter', {'low': 0.3, 'high': 0.7}, 'band', 'band'))"
    )
    assert imported(driver, ("transformers.modeling_utils", "verl")) == []


def test_a_trial_worker_imports_neither_scikit_learn_nor_scipys_statistics():
    """A trial's worker runs `tune_dfrl.tune.trial.run_cell` and makes the tiny model: the ledger's statistics live in
    the driver (`tune_dfrl.tune.results_log`), and transformers sees scikit-learn and scipy as not installed
    (`import_hooks.lighten_transformers`): ~1 CPU-s of imports per worker."""
    worker = (
        "import torch; import tune_dfrl.tune.trial;"
        "from tune_dfrl.trainers.embedded.model import ModelShape, build_tokenizer, new_model;"
        "import tune_dfrl.trainers.embedded.grpo;"
        "new_model(ModelShape(), len(build_tokenizer()), torch.Generator().manual_seed(0));"
        "import transformers.generation.candidate_generator"
    )
    modules = ("sklearn", "scipy.stats", "tune_dfrl.paired.ledger", "transformers.modeling_utils")
    assert imported(worker, modules) == ["transformers.modeling_utils"]  # the model was made, with neither


def test_a_trial_imports_torch_only_through_its_backend(tmp_path):
    """`tune_dfrl.tune.trial.run_cell` leaves torch to the backend (the embedded one sets its own threads): a trial whose
    backend trains elsewhere or without torch (verl's child process; the verl backend's checks, which import the
    policies, run in the driver only; the tests' synthetic backend) does not pay its imports (~1.5 CPU-s per trial
    process), and records the CPUs it was given as its threads."""
    trial = f"""
import tune_dfrl.trainers.verl.backend  # a verl trial's process: the launcher of verl's child
from ray import tune
from tune_dfrl.backends.base import Milestone
from tune_dfrl.tune.trial import CellJob, run_cell
reported = []
tune.report = reported.append  # run_cell outside a Tune session: what it reports
class NoTorch:
    recipe = {{"steps": 2, "milestone_every": 1}}
    def run_trial(self, arm, seed, report, checkpoint_dir):
        for step in (1, 2):
            report(Milestone(step, {{"b": 50.0}}, {{"b": 10.0}}, {{"b": 0.0}}, {{"db": 50.0}}))
arm = {{"method": "baseline", "params": {{}}, "arm_id": "c0", "label": "baseline"}}
run_cell({{"arm": arm, "seed": 0}}, CellJob(NoTorch(), {str(tmp_path)!r}, 3, "c0"))
assert [(r["step"], r["threads"]) for r in reported] == [(1.0, 3), (2.0, 3)], reported
"""
    assert imported(trial, ("torch",)) == []


def test_backend_contract():
    backend: Backend = EmbeddedBackend()
    assert backend.name == "embedded"
    infos = backend.benchmarks()
    assert len(infos) == 12 and {i.domain for i in infos} == {"math", "logic", "science"}
    assert backend.recipe == asdict(EmbeddedRecipe())
    assert backend.resources() == {"cpu": 1, "gpu": 0}
    assert EmbeddedBackend({"cpus_per_trial": 2}).resources() == {"cpu": 2, "gpu": 0}
    assert EmbeddedRecipe.from_dict({"cpus_per_trial": 2}).threads == 2
    assert EmbeddedRecipe.from_dict({"cpus_per_trial": 2, "num_threads": 1}).threads == 1
    assert backend.calibrate().ok


@pytest.mark.parametrize(
    "recipe,match",
    [
        ({"stepz": 10}, r"unknown embedded recipe key\(s\) \['stepz'\]; allowed: steps, milestone_every"),
        ({"steps": 20, "milestone_every": 50}, r"'steps' \(20\) is smaller than 'milestone_every' \(50\)"),
        ({"eval_benchmarks": ["math_sum3", "gsm8k"]}, r"unknown benchmark or domain name\(s\) \['gsm8k'\]"),
        ({"eval_benchmarks": ["chemistry"]}, r"allowed domains: math, logic, science"),
        ({"rollout_n": 1}, r"backend.rollout_n=1: allowed: an integer >= 2"),
        ({"lr": 0}, r"backend.lr=0: allowed: a number > 0"),
        ({"steps": "abc"}, r"backend.steps='abc': allowed: an integer >= 1"),
        ({"clip_ratio": 1}, r"backend.clip_ratio=1: allowed: a number in \(0, 1\)"),
        ({"num_threads": 0}, r"backend.num_threads=0: allowed: null or an integer >= 1"),
        ({"max_new_tokens": 3}, r"'max_new_tokens' \(3\) must exceed the longest answer"),
        ({"base": {"stepss": 5}}, r"unknown base-model recipe key\(s\) \['stepss'\]"),
        ({"base": {"steps": 0}}, r"backend.base.steps=0: allowed: an integer >= 1"),
        ({"base": {"mistake_rate": 1.5}}, r"backend.base.mistake_rate=1.5: allowed: a number in \[0, 1\]"),
        ({"base": {"shape": {"width": 5}}}, r"unknown model shape key\(s\) \['width'\]"),
    ],
)
def test_bad_recipe(recipe, match, tmp_path):
    _refused(BASELINE, recipe, tmp_path, match)


@pytest.mark.parametrize(
    "arm,match",
    [
        (ArmSpec("difffilterr", {}, "x", "x"), r"unknown method 'difffilterr'; allowed: .*difffilter"),
        (ArmSpec("softmax", {"temprature": 1.0}, "x", "x"), r"unknown parameter 'temprature' for softmax"),
        (ArmSpec("gfpo", {"k": 5}, "x", "x"), r"parameter .k. for gfpo must be in \[1, 4\] at rollout_n=5"),
        (ArmSpec("static", {"proportions": [0.5, 0.5]}, "x", "x"), r"static proportions must be 3 numbers"),
    ],
)
def test_bad_arm(arm, match, tmp_path):
    _refused(arm, {}, tmp_path, match)


def test_arm_needing_a_signal_the_backend_lacks(monkeypatch, tmp_path):
    """A policy that reads rollout_is_weights (never set by this backend) is refused up front."""
    needs_is = scorers.Scorer("is_weight", (), lambda batch, p: batch.rollout_is_weights.sum(dim=1).double())
    monkeypatch.setitem(scorers.SCORERS, "is_weight", needs_is)
    monkeypatch.setitem(registry.ALL_METHODS, "is_softmax", ("is_weight", "softmax"))
    arm = ArmSpec("is_softmax", {}, "x", "softmax on IS weights")
    _refused(arm, {}, tmp_path, r"cannot run on the embedded backend, which provides the signals group, domain, reward")


def test_validate_accepts_every_paper_method():
    backend = EmbeddedBackend()
    for method in registry.PAPER_METHODS:
        backend.validate(ArmSpec(method, {}, method, method))
