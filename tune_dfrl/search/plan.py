"""Stage 1 of a search, the plan: every setting, path and service checked; nothing written, nothing trained.

`compose` turns command-line overrides into the search config (a misspelt key lists the keys
allowed there; an override Hydra cannot parse is named); `plan_search` reads it into typed settings
(`tune_dfrl.config.settings`), builds the backend and its recipe, validates the arms, asks the backend what
this machine lacks for its trials (a backend with `machine_problems`, e.g. verl on cuda), and checks
the output folder (free, writable, new or the same search), the tracking store, the caches and the
Ray address. Anything wrong is a `ValueError` with one line that names the key, the value and what
is allowed: the CLI prints it as `error: ...`, exit 2. Under `dry_run=true` what this machine lacks
is kept as the plan's `warnings` instead, and `dry_run_lines` describes the plan.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from tune_dfrl.backends.base import SCORE, ArmSpec, Backend
from tune_dfrl.backends.benchmarks import BUILTIN_AGGREGATIONS
from tune_dfrl.backends.registry import backend_errors, get_backend
from tune_dfrl.cluster.services import (
    check_folder,
    check_ray_address,
    check_sqlite_file,
    check_tracking_uri,
    ray_address,
    sqlite_path,
)
from tune_dfrl.config.cache_root import CACHE_ENV, default_cache_dir
from tune_dfrl.config.settings import (
    AUTO_SEEDS,
    RaySettings,
    ReportSettings,
    SchedulerSettings,
    SearcherSettings,
    SearchSettings,
    as_dict,
    from_mapping,
    register_settings,
)
from tune_dfrl.errors import SearchError, SettingsError
from tune_dfrl.paired.sequential import SequentialRule
from tune_dfrl.report.confirm import Candidate, Screen, load_screen
from tune_dfrl.state.control_cache import default_cache_root
from tune_dfrl.state.folder import CELLS, CHECKPOINT, LOCK, OPTUNA_DB, PLAN
from tune_dfrl.state.resume import STATE_FORMAT, check_folder_free, check_state_format, describe_differences
from tune_dfrl.tracking.writer import default_tracking_uri
from tune_dfrl.tune.spaces import ArmFactory, SearchSpace, available_spaces, recipe_hash, space_file_text
from tune_dfrl.tune.trial import PlantedFault, cell_dir


@dataclass(frozen=True)
class ConfirmPlan:
    """A confirm search (`confirm.screen=DIR`): the screen read, and its top `top` candidates as this search's arms
    (`arms`: this search's arm id -> the screen's candidate; the ids differ, the recipe hash being the target's)."""

    given: str  # confirm.screen as given
    top: int
    screen: Screen
    arms: dict[str, Candidate]

    def suggestions(self) -> list[dict[str, Any]]:
        """The arms as the searcher suggests them, best screen Δ first."""
        return [c.suggestion() for c in self.arms.values()]

    def describe(self) -> dict[str, Any]:
        return {
            "screen": self.given,
            "screen_folder": str(self.screen.folder),
            "screen_experiment": self.screen.plan.get("experiment", ""),
            "top": self.top,
            "arms": {
                arm_id: {"screen_arm_id": c.arm_id, "label": c.label, "screen_delta": c.delta}
                for arm_id, c in self.arms.items()
            },
        }

    def fingerprint(self) -> dict[str, Any]:
        return {"screen": self.given, "top": self.top, "screen_arms": [c.arm_id for c in self.arms.values()]}


GROUPS = ("space", "backend")  # config groups; every other top-level key is a `SearchSettings` field


@dataclass(frozen=True)
class Plan:
    """A validated search: everything the run and the finish need, nothing written yet."""

    space: SearchSpace
    seeds: tuple[int, ...]
    n_arms: int
    backend_name: str
    backend: Backend
    recipe: dict[str, Any]
    milestones: tuple[int, ...]
    control: ArmSpec
    make_arm: ArmFactory
    aggregate: str
    scheduler: SchedulerSettings
    searcher: SearcherSettings
    report: ReportSettings
    out: Path
    tracking_uri: str
    experiment: str
    ray: RaySettings
    resume: bool = False
    retry_failed: bool = False
    max_retries: int = 0
    control_cache: Path | None = None
    faults: tuple[PlantedFault, ...] = ()
    sequential: SequentialRule | None = None  # seeds=auto: `seeds` are the starting seeds
    dry_run: bool = False  # check and describe the search; start nothing
    warnings: tuple[str, ...] = ()  # under dry_run: what this machine lacks for the trials (else those are errors)
    confirm: ConfirmPlan | None = None  # confirm.screen=DIR: the screen's top arms, confirmed on this recipe

    @property
    def possible_seeds(self) -> tuple[int, ...]:
        """Every seed a cell may run on: the seeds, or under seeds=auto 0..max-1."""
        return tuple(range(self.sequential.max)) if self.sequential is not None else self.seeds

    @property
    def metric(self) -> str:
        return SCORE + self.aggregate

    @property
    def total_cells(self) -> int:
        """Cells of the search (under seeds=auto the most it may run)."""
        return (self.n_arms + 1) * len(self.possible_seeds)

    def resume_hint(self, extra: str = "") -> str:
        """What to run to continue this search; `extra`: more overrides (e.g. " retry_failed=true")."""
        return f"run the same command with resume=true{extra} out={self.out}"

    def describe(self) -> dict[str, Any]:
        """The plan as JSON-able settings (search.json, MLflow params)."""
        return {
            "space": self.space.name,
            "seeds": list(self.seeds),
            "arms": self.n_arms,
            "backend": self.backend_name,
            "recipe": self.recipe,
            "recipe_hash": self.make_arm.recipe_hash,
            "milestones": list(self.milestones),
            "control": asdict(self.control),
            "metric": self.metric,
            "scheduler": as_dict(self.scheduler),
            "searcher": as_dict(self.searcher),
            "report": as_dict(self.report),
            "tracking_uri": "" if self.tracking_uri == default_tracking_uri(self.out) else self.tracking_uri,
            "experiment": self.experiment,
            "ray_address": self.ray.address,
            "max_retries": self.max_retries,
            "control_cache": str(self.control_cache) if self.control_cache else None,
            **self._sequential(),
            **({"confirm": self.confirm.describe()} if self.confirm is not None else {}),
        }

    def _sequential(self) -> dict[str, Any]:
        return {"sequential": asdict(self.sequential)} if self.sequential is not None else {}

    def fingerprint(self) -> dict[str, Any]:
        """What `resume=true` must find unchanged in the stored search (JSON-normalised)."""
        space = {k: v for k, v in asdict(self.space).items() if k != "description"}
        return json.loads(
            json.dumps(
                {
                    "space": space,
                    "backend": self.backend_name,
                    "recipe": self.recipe,
                    "seeds": list(self.seeds),
                    "metric": self.metric,
                    "scheduler": as_dict(self.scheduler),
                    "searcher": as_dict(self.searcher),
                    **self._sequential(),
                    **({"confirm": self.confirm.fingerprint()} if self.confirm is not None else {}),
                },
                default=str,
            )
        )


def register_configs() -> None:
    """Hydra configs that are derived, not written: every file of `search_spaces/` as an option of the
    group `space`, the embedded recipe's dataclass defaults as `backend_defaults/embedded`, and the
    settings' defaults (`tune_dfrl.config.settings`)."""
    from hydra.core.config_store import ConfigStore

    from tune_dfrl.trainers.embedded.recipe import EmbeddedRecipe

    store = ConfigStore.instance()
    for name in available_spaces():
        store.store(group="space", name=name, node=yaml.safe_load(space_file_text(name)))
    store.store(group="backend_defaults", name="embedded", node=asdict(EmbeddedRecipe()))
    register_settings()


def compose(overrides: list[str]) -> dict[str, Any]:
    """The search config exactly as `python -m tune_dfrl.search OVERRIDES...` composes it; an override of a key
    that does not exist -> SettingsError listing the keys allowed at that level."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_module
    from hydra.errors import ConfigCompositionException, HydraException, OverrideParseException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    register_configs()
    with initialize_config_module(config_module="tune_dfrl.conf", version_base="1.3"):
        try:
            return OmegaConf.to_container(hydra_compose("search", overrides=overrides), resolve=True)
        except ConfigCompositionException as error:
            misspelt = re.match(r"Could not override '([^']+)'", str(error))
            if misspelt is None:
                raise SettingsError(str(error).split("Config search path")[0].strip()) from None
            groups = [o for o in overrides if o.split("=", 1)[0] in GROUPS]
            node: Any = OmegaConf.to_container(hydra_compose("search", overrides=groups), resolve=True)
            parent, _, name = misspelt.group(1).rpartition(".")
            for part in filter(None, parent.split(".")):
                node = node.get(part) if isinstance(node, dict) else None
            prefix = parent + "." if parent else ""
            allowed = ", ".join(prefix + k for k in node) if isinstance(node, dict) else "(none)"
            raise SettingsError(f"unknown key {prefix + name!r}; allowed keys: {allowed}") from None
        except OverrideParseException as error:
            bad = next((o for o in overrides if not _parses(o)), " ".join(overrides))
            raise SettingsError(
                f"Hydra cannot parse the override {bad!r}: {_one_line(str(error))}; quote a value that holds "
                "'=', ',', brackets or spaces, e.g. \"key=['a.b=1','c']\""
            ) from None
        except (HydraException, OmegaConfBaseException) as error:
            raise SettingsError(f"the command line does not compose: {_one_line(str(error))}") from None


def _parses(override: str) -> bool:
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    try:
        OverridesParser.create().parse_overrides([override])
    except OverrideParseException:
        return False
    return True


def _one_line(text: str) -> str:
    """`text` without Hydra's link to its grammar documentation, its lines joined."""
    return " ".join(line.strip() for line in text.splitlines() if line.strip() and not line.startswith("See https"))


def plan_search(cfg: dict[str, Any]) -> Plan:
    """Validate a search config (the Hydra config as a plain dict) and build the plan; writes nothing."""
    settings = from_mapping(SearchSettings, {k: v for k, v in cfg.items() if k not in GROUPS})
    backend_cfg = dict(cfg["backend"])
    backend_name = backend_cfg.pop("name")
    budget = {
        k: v for k, v in (("steps", settings.steps), ("milestone_every", settings.milestone_every)) if v is not None
    }
    backend = get_backend(backend_name, {**backend_cfg, **budget})
    recipe = backend.recipe
    steps, every = int(recipe["steps"]), int(recipe["milestone_every"])
    if every < 1 or steps < every:
        raise SearchError(
            f"step budget steps={steps} is shorter than one milestone (milestone_every={every}); "
            "need steps >= milestone_every >= 1"
        )
    milestones = tuple(sorted({*range(every, steps + 1, every), steps}))

    space = SearchSpace.from_mapping(dict(cfg["space"]), int(recipe["rollout_n"]))
    screen = load_screen(settings.confirm.screen, settings.confirm.top) if settings.confirm.screen else None
    if screen is not None and screen.space != space.name:
        raise SearchError(
            f"confirm.screen={settings.confirm.screen}: the screen searched space {screen.space!r}, not "
            f"{space.name!r}; give space={screen.space}"
        )
    sequential = SequentialRule.of(settings.sequential, settings.report.alpha) if settings.seeds == AUTO_SEEDS else None
    seeds = (
        tuple(range(sequential.start))
        if sequential is not None
        else tuple(range(settings.seeds))
        if isinstance(settings.seeds, int)
        else tuple(settings.seeds)
    )
    if screen is not None:
        seeds = confirm_seeds(settings.seeds, seeds, sequential, screen.possible_seeds)
    aggregations = [*BUILTIN_AGGREGATIONS, *(recipe.get("subsets") or {})]
    if settings.metric not in aggregations:
        raise SearchError(
            f"metric={settings.metric!r}: allowed (aggregations the backend reports): {', '.join(aggregations)}"
        )

    make_arm = ArmFactory(int(recipe["rollout_n"]), recipe_hash(recipe), binary_rewards=backend.binary_rewards)
    control = make_arm({"method": space.control_method, "params": space.control_params})
    confirm = _confirm_plan(settings.confirm.screen, settings.confirm.top, screen, make_arm, control)
    if confirm is not None:
        with backend_errors(backend_name, "validate the arms"):
            for arm in confirm.arms:
                backend.validate(make_arm(confirm.arms[arm].suggestion()))
    with backend_errors(backend_name, "validate the arms"):
        for suggestion in [
            {"method": space.control_method, "params": space.control_params},
            *space.default_suggestions(),
        ]:
            backend.validate(make_arm(suggestion))
    with backend_errors(backend_name, "check this machine"):
        problems = tuple(backend.machine_problems()) if hasattr(backend, "machine_problems") else ()
    if problems and not settings.dry_run:
        raise SearchError(problems[0])

    if settings.resume and not settings.out:
        raise SearchError("resume=true needs out=DIR: the output directory of the search to continue")
    if settings.retry_failed and not settings.resume:
        raise SearchError(
            "retry_failed=true runs the failed cells of a stored search again: it needs resume=true out=DIR"
        )
    out = Path(settings.out or f"runs/{space.name}-{time.strftime('%Y%m%d-%H%M%S')}").expanduser().absolute()
    address = ray_address(settings.ray.address)
    if address is not None and settings.ray.num_cpus is not None:
        raise SearchError(
            f"ray.num_cpus sizes a private local cluster; the running cluster at {address!r} owns its "
            "resources: drop ray.num_cpus, or drop ray.address (and RAY_ADDRESS)"
        )
    cache = settings.control_cache
    control_cache = (
        None if cache is None else default_cache_root() if cache == "auto" else Path(cache).expanduser().absolute()
    )

    plan = Plan(
        space,
        seeds,
        settings.arms if confirm is None else confirm.top,
        backend_name,
        backend,
        recipe,
        milestones,
        control,
        make_arm,
        settings.metric,
        settings.scheduler,
        settings.searcher,
        settings.report,
        out,
        settings.mlflow.tracking_uri or "",
        settings.mlflow.experiment or "",
        replace(settings.ray, address=address),
        settings.resume,
        settings.retry_failed,
        settings.max_retries,
        control_cache,
        sequential=sequential,
        dry_run=settings.dry_run,
        warnings=problems,
        confirm=confirm,
    )
    plan = replace(plan, faults=_faults(settings.fault_injection, plan.possible_seeds, milestones))
    _check_storage(plan)
    check_folder_free(out)
    stored = check_out(plan)
    plan = replace(
        plan,
        tracking_uri=plan.tracking_uri or _stored_store(stored) or default_tracking_uri(out),
        experiment=plan.experiment or stored.get("experiment") or f"tune_dfrl/{out.name}",
    )
    if (store := sqlite_path(plan.tracking_uri)) is not None:
        check_sqlite_file("mlflow.tracking_uri", store)
    check_tracking_uri(plan.tracking_uri)
    if address is not None:
        check_ray_address(address)
    return plan


def confirm_seeds(
    value: Any, seeds: tuple[int, ...], sequential: SequentialRule | None, screen_seeds: tuple[int, ...]
) -> tuple[int, ...]:
    """A confirm search's seeds, disjoint from every seed the screen may have used: a count n means the n smallest
    seeds >= 0 the screen did not use; a list (or seeds=auto's seeds 0..sequential.max-1) sharing a seed with the
    screen's is refused."""
    used = set(screen_seeds)
    if isinstance(value, int) and sequential is None:
        free = (s for s in range(len(used) + value) if s not in used)
        return tuple(next(free) for _ in range(value))
    possible = tuple(range(sequential.max)) if sequential is not None else seeds
    if overlap := sorted(used & set(possible)):
        given = f"seeds=auto (seeds 0..{sequential.max - 1})" if sequential is not None else f"seeds={list(seeds)}"
        raise SearchError(
            f"{given} shares seed(s) {overlap} with the screen's {sorted(used)}; a confirmation needs seeds disjoint "
            "from the screen's: give a count (seeds=n takes the n smallest seeds the screen did not use) or other seeds"
        )
    return seeds


def _confirm_plan(
    given: str | None, top: int, screen: Screen | None, make_arm: ArmFactory, control: ArmSpec
) -> ConfirmPlan | None:
    """The screen's top `top` candidates as this recipe's arms; each must stay a distinct arm that is not the
    control under this recipe."""
    if screen is None or given is None:
        return None
    arms: dict[str, Candidate] = {}
    for candidate in screen.candidates[:top]:
        arm = make_arm(candidate.suggestion())
        if arm.arm_id == control.arm_id or arm.arm_id in arms:
            same = "the control" if arm.arm_id == control.arm_id else arms[arm.arm_id].label
            raise SearchError(
                f"confirm.screen={given}: the screen's arm {candidate.label} acts as {same} under this recipe; "
                "nothing to confirm for it: give another confirm.top"
            )
        arms[arm.arm_id] = candidate
    return ConfirmPlan(given, top, screen, arms)


def _stored_store(stored: dict[str, Any]) -> str:
    """The tracking URI a resumed search keeps: the one it was given, none for the folder's own store (wherever the
    folder is now; search.json of an earlier version names that store by its absolute path, with `out`)."""
    uri = stored.get("tracking_uri") or ""
    return "" if "out" in stored and uri == default_tracking_uri(Path(stored["out"])) else uri


def dry_run_lines(plan: Plan) -> list[str]:
    """The plan as a dry run prints it: arms, seeds, cells, steps, rungs, each trial's resources, and the first
    trial's command line (a backend with `trial_command`, e.g. verl; the embedded backend trains in the trial)."""
    from tune_dfrl.config.settings import PAIRED_SCHEDULERS
    from tune_dfrl.paired.rungs import RungRule
    from tune_dfrl.tune.scheduler import asha_grace_step

    seeds = (
        f"seeds=auto: {list(plan.seeds)} first, at most {len(plan.possible_seeds)}"
        if plan.sequential is not None
        else f"seeds {list(plan.seeds)}"
    )
    scheduler = plan.scheduler
    rungs = (
        f"rungs at steps {list(RungRule.of(scheduler).rungs(plan.milestones))}"
        if scheduler.name in PAIRED_SCHEDULERS
        else f"Ray's ASHA from step {asha_grace_step(scheduler, plan.milestones)}"
        if scheduler.name == "asha"
        else "no rungs (every trial runs to the end)"
    )
    with backend_errors(plan.backend_name, "size a trial"):
        resources = plan.backend.resources()
    lines = [
        f"dry run of search {plan.space.name}: nothing started, nothing written",
        f"arms: the control ({plan.control.label}) + {plan.n_arms} searched; {seeds}; {plan.total_cells} cells at most",
        f"steps: {max(plan.milestones)} per trial, milestones at {list(plan.milestones)}; "
        f"scheduler {scheduler.name}: {rungs}",
        f"resources per trial (asked of Ray Tune): {json.dumps(resources)}",
        f"backend {plan.backend_name}; output folder {plan.out}",
    ]
    if plan.confirm is not None:
        lines.append(
            f"confirm of the screen {plan.confirm.screen.folder}: its top {plan.confirm.top} arms "
            f"({', '.join(c.label for c in plan.confirm.arms.values())}) on seeds disjoint from its "
            f"{list(plan.confirm.screen.possible_seeds)}"
        )
    if hasattr(plan.backend, "trial_command"):
        seed = plan.seeds[0]
        folder = cell_dir(plan.out / CELLS, plan.control.arm_id, seed) / CHECKPOINT
        with backend_errors(plan.backend_name, "build a trial's command"):
            command = plan.backend.trial_command(plan.control, seed, folder)
        lines.append(f"first trial (the control at seed {seed}): {shlex.join(command)}")
    return lines


def _check_storage(plan: Plan) -> None:
    """The output folder, its sqlite study and the caches can be written (`tune_dfrl.cluster.services`)."""
    check_folder("out", plan.out)
    check_sqlite_file("out", plan.out / OPTUNA_DB)
    if plan.control_cache is not None:
        check_folder("control_cache", plan.control_cache)
    if os.environ.get(CACHE_ENV):
        check_folder(CACHE_ENV, default_cache_dir().absolute())


def check_out(plan: Plan) -> dict[str, Any]:
    """A new search needs an empty `out`; a resumed one the same search in it. Returns the stored search.json ({} if new)."""
    out, stored = plan.out, plan.out / PLAN
    if not plan.resume:
        if stored.exists():
            raise SearchError(
                f"{out} already holds a search; pass resume=true to continue it, or choose another out=DIR"
            )
        if out.exists() and any(p.name != LOCK for p in out.iterdir()):
            raise SearchError(f"output directory {out} is not empty; choose another out=DIR")
        return {}
    if not stored.exists():
        raise SearchError(
            f"resume=true: there is no previous search in {out} (no search.json); run without resume=true to start one"
        )
    previous = json.loads(stored.read_text())
    check_state_format(out, previous)
    before, now = previous.get("fingerprint", {}), plan.fingerprint()
    if before != now:
        raise SearchError(
            f"resume=true: {out} holds a different search ({describe_differences(before, now)}); "
            "resume with the settings it was started with, or choose another out=DIR"
        )
    return previous


def _faults(value: Any, seeds: tuple[int, ...], milestones: tuple[int, ...]) -> tuple[PlantedFault, ...]:
    """TEST ONLY: `fault_injection` (one fault or a list) -> planted faults, each at a seed and milestone of the search."""
    faults = []
    for entry in [] if value is None else value if isinstance(value, list) else [value]:
        if not isinstance(entry, dict):
            raise SearchError(f"fault_injection {entry!r}: give a mapping {{arm, seed, step, times}}")
        unknown = sorted(set(entry) - {"arm", "seed", "step", "times"})
        if unknown or not {"arm", "seed", "step"} <= set(entry):
            raise SearchError(
                f"fault_injection {entry}: keys arm, seed, step (required) and times; got {sorted(entry)}"
            )
        if entry["seed"] not in seeds or entry["step"] not in milestones:
            raise SearchError(
                f"fault_injection {entry}: seed must be one of {list(seeds)}, step one of the milestones {list(milestones)}"
            )
        faults.append(PlantedFault(str(entry["arm"]), int(entry["seed"]), int(entry["step"]), entry.get("times")))
    return tuple(faults)


def save_plan(plan: Plan) -> None:
    """OUT/search.json: the plan and its fingerprint (what `resume=true` checks)."""
    (plan.out / PLAN).write_text(
        json.dumps({**plan.describe(), "fingerprint": plan.fingerprint(), "state_format": STATE_FORMAT}, indent=2)
    )
