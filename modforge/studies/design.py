"""A study's design, read from its experiment's ``study:`` block and the command line: the arms (the baseline and
the configurations compared with it), the rungs of the ladder, the tuning grid and seeds, the comparison's
seeds and looks, the budget. Checked whole, in one line per mistake, before any run."""
import math
from dataclasses import dataclass, field
from typing import Optional

from modforge.config.study import check_study
from modforge.errors import ConfigError
from modforge.studies import lrfit, sequential, tuning


@dataclass
class Design:
    experiment: str
    overrides: list  # the command line's, applied to every job
    study: dict  # the checked block
    arms: dict  # name (its spec, e.g. "norm=rms") -> {key: value}
    baseline: str
    rungs: dict  # name -> {key: value}, smallest first ({"": {}} without a ladder)
    grid: dict = field(default_factory=dict)  # {key: [values]}: the tuning grid ({} without tuning)
    tune_seeds: list = field(default_factory=list)
    extend: int = 0
    seeds: dict = field(default_factory=dict)  # min, max, step, start
    looks: list = field(default_factory=list)
    jobs: int = 1
    base: dict = field(default_factory=dict)  # the composed config's max_steps, val_check_interval, eval_at_start

    @property
    def scales(self) -> dict:
        """``study.tune.scale``: {arm: {key: factor}} ({} when none is declared)."""
        return (self.study.get("tune") or {}).get("scale") or {}

    def grid_of(self, arm: str) -> dict:
        """The arm's tuning grid: the declared one, each key times the arm's factor in ``study.tune.scale``."""
        scale = self.scales.get(arm, {})
        return {k: [float(f"{v * scale[k]:.6g}") if k in scale else v for v in values]
                for k, values in self.grid.items()}

    def setting_of(self, arm: str, rung: str, key: str):
        """A config value as a job of this arm and rung has it: the arm's or rung's override, else the config's."""
        ov = {**self.arms[arm], **self.rungs[rung]}
        for k in (key, key.split(".")[-1]):
            if k in ov:
                return _parsed(ov[k])
        return self.base.get(key.split(".")[-1])

    @property
    def cliff(self) -> Optional[dict]:
        return (self.study.get("tune") or {}).get("cliff")

    @property
    def rule(self) -> str:
        """How each arm's setting is chosen: fit (:mod:`modforge.studies.lrfit`) or best (the best mean, then the
        cliff rule: :mod:`modforge.studies.tuning`)."""
        return (self.study.get("tune") or {}).get("rule", "best" if self.cliff else "fit")

    @property
    def fit(self) -> dict:
        """rule: fit's settings: key (the rate fitted in log2), spike, fail_level, basin."""
        t = self.study.get("tune") or {}
        return {"key": t.get("key", "optim.lr"), "spike": t.get("spike", lrfit.SPIKE),
                "fail_level": t.get("fail_level", lrfit.FAIL_LEVEL),
                "delta": t.get("basin", self.margin if self.margin is not None else 0.02)}

    @property
    def metric(self) -> str:
        return self.study.get("metric", "val/loss")

    @property
    def better(self) -> str:
        return self.study.get("better", "min")

    @property
    def level(self) -> float:
        return float(self.study.get("level", 0.95))

    @property
    def margin(self) -> Optional[float]:
        m = self.study.get("margin")
        return None if m is None else float(m)

    @property
    def compared(self) -> list:
        return [a for a in self.arms if a != self.baseline]

    @property
    def family(self) -> int:
        """Members of the family: every comparison at every rung."""
        return len(self.compared) * len(self.rungs)

    @property
    def transfer(self) -> Optional[str]:
        """The one rule every arm's setting is carried up by, or None (none, or one per arm: :meth:`transfer_of`)."""
        t = self.study.get("transfer")
        return None if isinstance(t, dict) else t

    def transfer_of(self, arm: str) -> Optional[str]:
        """The rule that carries ``arm``'s setting up from the smallest rung; None: the arm is tuned at every rung
        (``study.transfer`` a rule for every arm, or a mapping {arm: rule} for some)."""
        t = self.study.get("transfer")
        return t.get(arm) if isinstance(t, dict) else t

    @property
    def carry(self) -> Optional[dict]:
        """``study.carry``: {tuned, check}: rates carried up a ladder by a power law (:mod:`modforge.studies.carry`)."""
        return self.study.get("carry")

    def tuned_rungs_of(self, arm: str) -> list:
        """The rungs ``arm`` is tuned on: every one, the smallest with a transfer rule, or the lowest ``carry.tuned``."""
        if self.carry:
            return list(self.rungs)[:self.carry["tuned"]]
        return list(self.rungs)[:1] if self.transfer_of(arm) else list(self.rungs)

    @property
    def tuned_rungs(self) -> list:
        """The rungs some arm is tuned on, in ladder order."""
        tuned = {r for a in self.arms for r in self.tuned_rungs_of(a)}
        return [r for r in self.rungs if r in tuned]


def parse_spec(spec: str) -> dict:
    return dict(p.split("=", 1) for p in spec.split(","))


def rung_name(overrides: dict) -> str:
    return ",".join(f"{k}={v}" for k, v in overrides.items())


def _parsed(v):
    """An override's value as YAML reads it (``"400"`` -> 400)."""
    import yaml

    try:
        return yaml.safe_load(str(v))
    except yaml.YAMLError:
        return v


def design_of(experiment: str, overrides: list, block: Optional[dict], jobs: Optional[int] = None,
              base: Optional[dict] = None) -> Design:
    """The design, or one line naming what is missing or wrong."""
    if not block:
        raise ConfigError(f"experiment={experiment}: it declares no study: block (question, metric, baseline, "
                          "compare, ...: docs/studies.md)")
    s = check_study(block)
    for key in ("baseline", "compare"):
        if key not in s:
            raise ConfigError(f"study.{key}: missing in experiment={experiment}; a study compares declared arms "
                              f"({'the baseline, e.g. norm=layer' if key == 'baseline' else 'e.g. [norm=rms]'})")
    arms = {s["baseline"]: parse_spec(s["baseline"])}
    for spec in s["compare"]:
        if spec in arms:
            raise ConfigError(f"study.compare: {spec} is listed twice (or is the baseline)")
        arms[spec] = parse_spec(spec)
    rungs = {rung_name(r): {str(k): v for k, v in r.items()} for r in s.get("sizes") or [{}]}
    if len(rungs) != len(s.get("sizes") or [{}]):
        raise ConfigError("study.sizes: two rungs are the same")
    tune = s.get("tune") or {}
    grid = tune.get("params") or {}
    seeds = s.get("seeds") or {"min": 3, "max": 3, "step": 1, "start": 1000}
    key = "jobs" if jobs is not None else "study.jobs"
    jobs = jobs if jobs is not None else int(s.get("jobs", default_jobs()))
    check_jobs(key, jobs)
    d = Design(experiment, list(overrides), s, arms, s["baseline"], rungs, grid, list(tune.get("seeds") or []),
               int(tune.get("extend", 0)), seeds, sequential.looks(seeds["min"], seeds["max"], seeds["step"]), jobs,
               dict(base or {}))
    check_keys(d)
    check_arms_and_grid(d)
    if d.tune_seeds and max(d.tune_seeds) >= seeds["start"]:
        raise ConfigError(f"study.seeds.start={seeds['start']}: the comparison's seeds must be fresh, above every "
                          f"tuning seed (study.tune.seeds={d.tune_seeds}); give study.seeds.start")
    for arm in d.scales:
        if arm not in arms:
            raise ConfigError(f"study.tune.scale: {arm} is not an arm of the study; its arms: {', '.join(arms)}")
    rules = s.get("transfer")
    if isinstance(rules, dict):
        for arm in rules:
            if arm not in arms:
                raise ConfigError(f"study.transfer: {arm} is not an arm of the study; a mapping of transfer rules "
                                  f"names arms: {', '.join(arms)}")
    for arm in arms:
        rule = d.transfer_of(arm)
        if not rule:
            continue
        where = f"study.transfer={rule}" if not isinstance(rules, dict) else f"study.transfer.{arm}={rule}"
        if rule not in tuning.TRANSFER:
            raise ConfigError(f"{where}: a transfer rule; rules: {', '.join(tuning.TRANSFER)}")
        small = list(rungs.values())[0]
        for name, rv in rungs.items():
            try:
                tuning.TRANSFER[rule]({k: 1.0 for k in d.grid}, small, rv, s.get("width_key", "model.d_model"))
            except ValueError as e:
                raise ConfigError(f"{where}: {e} (rung {name or 'the config'} does not)") from None
    if "tokens_per_param" in s and len(rungs) == 1 and not s.get("sizes"):
        pass  # one size with a token budget: allowed (a compute-matched comparison at one size)
    return d


# keys the runner sets in every job: the command line may not set them too
RUNNER_KEYS = ("seed", "trainer.max_steps", "trainer.val_check_interval")
PROBE_KEYS = ("eval_at_start", "sample")  # the probe sets these unless the command line does


def check_keys(d: Design) -> None:
    """No key set twice: by an arm and a rung, by the grid and either, by the command line and the runner."""
    grid_keys = set(d.grid)
    for arm, ov in d.arms.items():
        for rung, rv in d.rungs.items():
            both = set(ov) & set(rv)
            if both:
                raise ConfigError(f"study.sizes: rung {rung} sets {', '.join(sorted(both))}, which arm {arm} sets too")
        if set(ov) & grid_keys:
            raise ConfigError(f"study.tune.params: {', '.join(sorted(set(ov) & grid_keys))} is set by arm {arm}; "
                              "an arm cannot fix what every arm is tuned on")
    for rung, rv in d.rungs.items():
        if set(rv) & grid_keys:
            raise ConfigError(f"study.tune.params: {', '.join(sorted(set(rv) & grid_keys))} is set by rung {rung}")
    fixed = set(RUNNER_KEYS) | grid_keys | {k for ov in d.arms.values() for k in ov} | \
        {k for rv in d.rungs.values() for k in rv}
    for o in d.overrides:
        key = o.split("=", 1)[0].lstrip("+~")
        if ("=" not in o and not o.startswith("~")) or key.startswith("hydra"):
            raise ConfigError(f"{o}: give the study overrides of the config (key=value), not Hydra's or a sweep's")
        value = o.split("=", 1)[1] if "=" in o else ""
        if "," in value and not value.startswith(("[", "{", "'", '"')) and not key.startswith("study."):
            raise ConfigError(f"{o}: a sweep; the study decides its jobs (declare arms in study.compare, a grid in "
                              "study.tune.params)")
        if key in ("pause_at", "resume"):
            raise ConfigError(f"{o}: the study pauses and continues its runs itself (study.tune.halving; run the "
                              "same command again to continue a study)")
        if key in fixed:
            raise ConfigError(f"{o}: the study sets {key} in every job (an arm, a rung, the tuning grid, or the "
                              f"runner: {', '.join(RUNNER_KEYS)}); change it in the experiment's study: block")


def check_arms_and_grid(d: Design) -> None:
    """Arms that are variants and a grid that is a grid, in one line naming the study key: no arm equal to the
    baseline or differing from it only in a key the runner sets (a seed is not a variant), no arm or grid over
    a key the runner sets, no grid value listed twice."""
    base = d.arms[d.baseline]
    for spec, ov in d.arms.items():
        own = sorted(set(ov) & set(RUNNER_KEYS))
        if own:
            raise ConfigError(f"study.{'baseline' if spec == d.baseline else 'compare'}: {spec} sets {own[0]}, which "
                              f"the runner sets in every job ({', '.join(RUNNER_KEYS)}); an arm is a variant")
        if spec != d.baseline and {k: str(v) for k, v in ov.items()} == {k: str(v) for k, v in base.items()}:
            raise ConfigError(f"study.compare: {spec} is the baseline ({d.baseline}) written another way; "
                              "an arm must differ from it")
    for key, values in d.grid.items():
        if key in RUNNER_KEYS or key.lstrip("+~") in RUNNER_KEYS:
            raise ConfigError(f"study.tune.params.{key}: the runner sets {key} in every job ({', '.join(RUNNER_KEYS)}); "
                              "tune a setting of the model or its training")
        seen: set = set()
        for v in values:
            same = float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else str(v)  # 1e-3 == 0.001
            if same in seen:
                raise ConfigError(f"study.tune.params.{key}={values}: {v} is listed twice")
            seen.add(same)


def check_jobs(key: str, jobs: int, shown: Optional[str] = None) -> None:
    """Jobs side by side: 1 to this machine's cores. Each job is a process with its share of the cores (at least
    one thread), and the launcher starts as many slots as jobs: more jobs than cores only oversubscribe them."""
    import os

    cores = os.cpu_count() or 1
    if not 1 <= jobs <= cores:
        raise ConfigError(f"{key}={shown or jobs}: a whole number from 1 to {cores}, the cores here (jobs run side "
                          "by side, each a process with its share of the cores)")


def default_jobs() -> int:
    """Jobs side by side when the study does not say: 2 on a machine of 2 or more cores (measured: docs/studies.md),
    else 1."""
    import os

    return 2 if (os.cpu_count() or 1) >= 2 else 1


def finite(x: float) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)
