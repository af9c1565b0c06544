"""Calibration and contamination checks: pass on the shipped data, fail on planted defects."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys

from tune_dfrl.trainers.embedded import checks
from tune_dfrl.trainers.embedded.benchmarks import BENCHMARKS, get_benchmarks, training_pools
from tune_dfrl.trainers.embedded.checks import calibrate, contamination_check
from tune_dfrl.trainers.embedded.tasks import KINDS, Item


def test_calibration_passes_on_every_shipped_benchmark():
    result = calibrate()
    assert result.ok, result.failures
    assert result.failures == []


def test_calibration_fails_on_reference_answers_not_in_output_format():
    items = get_benchmarks(["math_sum3"])[0].items()[:5]
    padded = [dataclasses.replace(i, answer="0" + i.answer) for i in items]  # leading zero: not canonical
    result = calibrate({"math_sum3": items, "planted": padded})
    assert not result.ok
    assert len(result.failures) == 1 and result.failures[0].startswith("planted: 5/5 reference answers do not score 1")


def test_calibration_fails_when_a_parser_accepts_malformed_answers(monkeypatch):
    lenient = dataclasses.replace(KINDS["mc3"], answer_pattern=lambda prompt: re.compile(r"\s*[a-c].*"))
    monkeypatch.setitem(KINDS, "mc3", lenient)
    result = calibrate({"sci_mc3": get_benchmarks(["sci_mc3"])[0].items()})
    assert not result.ok
    cases = {line.split("(")[1].split(")")[0] for line in result.failures}
    assert cases == {"trailing space", "trailing '.'"}  # '=' and empty still fail the lenient pattern


def test_contamination_check_passes_on_shipped_pools():
    result = contamination_check()
    assert result.ok, result.failures
    assert result.exact == 0 and result.near == 0
    assert 0 < result.max_jaccard <= checks.JACCARD_THRESHOLD


def _pools_with(extra: list[Item]) -> dict[str, list[Item]]:
    pools = {d: list(v) for d, v in training_pools().items()}
    for item in extra:
        pools[item.domain].append(item)
    return pools


def test_contamination_check_finds_planted_exact_normalised_and_near_copies():
    add = get_benchmarks(["math_sum3"])[0].items()[0]
    mc = get_benchmarks(["sci_not4"])[0].items()[0]
    words = re.findall(r"(\w+)\([a-e]\)", mc.prompt)
    question = mc.prompt.rsplit(")", 1)[1].strip()
    shuffled = " ".join(f"{w}({'abcde'[k]})" for k, w in enumerate(words[1:] + words[:1])) + " " + question
    last = max(words)  # the last word of the normal form: change its last letter
    near = mc.prompt.replace(f"{last}(", f"{last[:-1]}{'x' if last[-1] != 'x' else 'y'}(")

    result = contamination_check(pools=_pools_with([add]))
    assert (result.exact, result.near) == (1, 0) and not result.ok
    assert result.failures == [f"exact: training {add.prompt!r} = evaluation {add.prompt!r}"]

    result = contamination_check(pools=_pools_with([dataclasses.replace(mc, prompt=shuffled)]))
    assert result.exact == 1 and shuffled != mc.prompt

    result = contamination_check(pools=_pools_with([dataclasses.replace(mc, prompt=near)]))
    assert result.exact == 0 and result.near == 1 and result.max_jaccard > checks.JACCARD_THRESHOLD
    assert result.failures[0].startswith(f"near: training {near!r} ~ evaluation {mc.prompt!r}")


def test_cli_exit_status(monkeypatch, capsys):
    done = subprocess.run(
        [sys.executable, "-m", "tune_dfrl.trainers.embedded.checks", "calibrate"], capture_output=True, text=True
    )
    assert done.returncode == 0 and f"calibration on {len(BENCHMARKS)} benchmarks: ok" in done.stdout
    monkeypatch.setattr(checks, "calibrate", lambda: checks.CalibrationResult(False, ["math_add: planted"]))
    assert checks.main(["calibrate"]) == 1
    assert "FAILED" in capsys.readouterr().out
