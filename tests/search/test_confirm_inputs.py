"""The confirm stage's bad input (`confirm.screen=DIR`), refused in the plan with one line before anything is written or
trained, and its seeds rule; no Ray: the screens are small folders written by `search_folder.build_search` (its
analysed arms topk(f=0.9) and topk(f=0.6) are the candidates, seeds 0..3)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import ray.cloudpickle
import search_helpers
from reliability_helpers import tree_bytes
from search_folder import build_search

from tune_dfrl.backends import registry as backend_registry
from tune_dfrl.errors import StateFormatError
from tune_dfrl.search.cli import SearchError, plan_search
from tune_dfrl.state.resume import STATE_FORMAT

ray.cloudpickle.register_pickle_by_value(sys.modules["search_helpers"])


@pytest.fixture(autouse=True)
def synthetic(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(backend_registry.BACKENDS, "synthetic", search_helpers.build)


@pytest.fixture(scope="module")
def screen(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished screen of space topk_keep: control c0, analysed a1 (Δ about +6) and a2 (+0.5), a3 stopped, a4 failed,
    a suggestion equivalent to the control."""
    out = tmp_path_factory.mktemp("screen") / "screen"
    build_search(out)
    plan = json.loads((out / "search.json").read_text())
    (out / "search.json").write_text(json.dumps({**plan, "space": "topk_keep", "state_format": STATE_FORMAT}))
    return out


def confirm(screen: Path, out: Path, *overrides: str):
    return plan_search(
        search_helpers.search_cfg(
            "space=topk_keep",
            "backend.name=synthetic",
            "control_cache=null",
            f"confirm.screen={screen}",
            f"out={out}",
            *overrides,
        )
    )


def refused(screen: Path, tmp_path: Path, *overrides: str, match: str, error: type = SearchError) -> None:
    before = tree_bytes(screen) if screen.is_dir() else None
    out = tmp_path / "confirm"
    with pytest.raises(error, match=match) as raised:
        confirm(screen, out, *overrides)
    assert "\n" not in str(raised.value)
    assert not out.exists()
    if before is not None:
        assert tree_bytes(screen) == before


def test_the_plan_takes_the_top_candidates_and_the_seeds_the_screen_did_not_use(screen: Path, tmp_path: Path) -> None:
    before = tree_bytes(screen)
    plan = confirm(screen, tmp_path / "out", "confirm.top=2", "seeds=3", "arms=9")
    assert plan.confirm is not None and plan.n_arms == 2
    assert [c.arm_id for c in plan.confirm.arms.values()] == ["a1", "a2"]  # best screen Δ first
    assert [c.label for c in plan.confirm.arms.values()] == ["topk(f=0.9)", "topk(f=0.6)"]
    assert plan.seeds == (4, 5, 6)  # the 3 smallest seeds >= 0 the screen (0..3) did not use
    assert set(plan.confirm.arms).isdisjoint({"a1", "a2"})  # this recipe's arm ids
    described = plan.describe()["confirm"]
    assert described["screen"] == str(screen) and described["top"] == 2
    assert plan.fingerprint()["confirm"] == {"screen": str(screen), "top": 2, "screen_arms": ["a1", "a2"]}
    assert confirm(screen, tmp_path / "out", "confirm.top=1", "seeds=[9,4]").seeds == (9, 4)
    assert tree_bytes(screen) == before and not (tmp_path / "out").exists()


def test_a_missing_screen_folder(tmp_path: Path) -> None:
    refused(tmp_path / "nowhere", tmp_path, match=r"confirm.screen=.*nowhere: no such folder")


def test_a_folder_without_a_search(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    refused(tmp_path / "empty", tmp_path, match=r"holds no search \(no search.json\)")


def test_an_unfinished_screen(screen: Path, tmp_path: Path) -> None:
    unfinished = tmp_path / "unfinished"
    unfinished.mkdir()
    (unfinished / "search.json").write_bytes((screen / "search.json").read_bytes())
    refused(unfinished, tmp_path, match=r"the screen is unfinished \(no summary.json\); finish it first")


def test_a_screen_still_running(screen: Path, tmp_path: Path) -> None:
    from tune_dfrl.state.resume import hold_folder

    running = tmp_path / "running"
    running.mkdir()
    for name in ("search.json", "summary.json", "results.jsonl"):
        (running / name).write_bytes((screen / name).read_bytes())
    lock = hold_folder(running)
    try:
        with pytest.raises(SearchError, match="the screen is unfinished, a driver still runs it"):
            confirm(running, tmp_path / "out", "confirm.top=1", "seeds=2")
    finally:
        import os

        os.close(lock)


def test_a_screen_of_another_state_format(screen: Path, tmp_path: Path) -> None:
    old = tmp_path / "old"
    old.mkdir()
    plan = json.loads((screen / "search.json").read_text())
    (old / "search.json").write_text(json.dumps({**plan, "state_format": 1}))
    refused(
        old, tmp_path, match="holds search state format 1; this tune_dfrl reads state format", error=StateFormatError
    )


def test_a_screen_of_another_space(screen: Path, tmp_path: Path) -> None:
    before = tree_bytes(screen)
    with pytest.raises(
        SearchError, match=r"the screen searched space 'topk_keep', not 'maxvar_keep'; give space=topk_keep"
    ):
        plan_search(
            search_helpers.search_cfg(
                "space=maxvar_keep",
                "backend.name=synthetic",
                f"confirm.screen={screen}",
                "confirm.top=2",
                f"out={tmp_path / 'o'}",
            )
        )
    assert tree_bytes(screen) == before and not (tmp_path / "o").exists()


def test_too_few_candidates(screen: Path, tmp_path: Path) -> None:
    refused(
        screen,
        tmp_path,
        "confirm.top=3",
        match=r"the screen has 2 candidate arm\(s\) .* but confirm.top=3; give confirm.top=2 or fewer",
    )


def test_seeds_that_overlap_the_screens(screen: Path, tmp_path: Path) -> None:
    refused(
        screen,
        tmp_path,
        "confirm.top=2",
        "seeds=[3,7]",
        match=r"seeds=\[3, 7\] shares seed\(s\) \[3\] with the screen's \[0, 1, 2, 3\]",
    )
    refused(
        screen,
        tmp_path,
        "confirm.top=2",
        "seeds=auto",
        match=r"seeds=auto \(seeds 0..15\) shares seed\(s\) \[0, 1, 2, 3\]",
    )


def test_the_seeds_rule() -> None:
    from tune_dfrl.paired.sequential import SequentialRule
    from tune_dfrl.report.confirm import Screen
    from tune_dfrl.search.plan import confirm_seeds

    rule = SequentialRule(start=2, batch=2, max=4, alpha=0.05)
    assert confirm_seeds(3, (0, 1, 2), None, (0, 2, 5)) == (1, 3, 4)  # the 3 smallest seeds the screen did not use
    assert confirm_seeds([7, 8], (7, 8), None, (0, 1)) == (7, 8)
    assert confirm_seeds("auto", (0, 1), rule, (10, 11)) == (0, 1)  # seeds=auto: 0..3, all new to the screen
    auto_screen = Screen(Path("screen"), {"seeds": [0, 1], "sequential": {"max": 6}}, ())
    assert auto_screen.possible_seeds == (0, 1, 2, 3, 4, 5)  # every seed a seeds=auto screen may have used
    assert confirm_seeds(2, (0, 1), None, auto_screen.possible_seeds) == (6, 7)
    with pytest.raises(
        SearchError, match=r"seeds=\[5, 9\] shares seed\(s\) \[5\] with the screen's \[0, 1, 2, 3, 4, 5\]"
    ):
        confirm_seeds([5, 9], (5, 9), None, auto_screen.possible_seeds)
