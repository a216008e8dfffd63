"""The seed rule: how many seeds each claim's configurations need, decided from a pilot by a rule fixed in
advance (the grid's ``seeds:``: ``klsweep.grid.seeds``; what ``klsweep study`` does with it: docs/STUDY.md,
"The seed rule").

From the pilot's runs (each configuration's first seeds), per claim: each side's spread (its variance, never the
difference between the sides), then the fewest seeds N a configuration at which the claim's own test reaches
power ``target`` at the claim's pre-registered effect, at the strictest level Holm may ask (ALPHA / m claims);
up to the budget (the seeds the grid lists), past which the claim is "inconclusive at N seeds; N' would decide
it". Collapses do not inflate the spread: a side's SD is over its stable runs, its unstable ones (diverged or
collapsed: ``claims.unstable``) counted apart as a rate. The rule's false-positive rate is simulated (a fixed
seed: the decision and its numbers are reproducible from the pilot's runs): studies with no true difference,
each run through the whole procedure (a pilot drawn, the rule's N from it, the rest of the runs drawn, the
claim's test). ``decide`` is the rule; ``RULE_TEXT`` states it; ``write_decision``/``read_decision`` keep it
beside the sweep (``DECISION_FILE``) for the report to show.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from klsweep.report.claims import (
    DEFAULT_EFFECT,
    METRIC_COLUMNS,
    claim_side,
    claim_size,
    finished,
    rate_at_effect,
    rate_power_args,
    unstable,
)
from klsweep.report.statistics import (
    ALPHA,
    Welch,
    rate_power,
    rate_test,
    tost_of,
    welch,
    welch_power,
)

if TYPE_CHECKING:
    import pandas as pd

    from klsweep.grid.claims import Claim
    from klsweep.grid.seeds import SeedRule

DECISION_FILE = "seeds.json"  # in the sweep folder: the rule's decision, written by the study
FRESH = 1000  # simulated studies behind each claim's false-positive rate
CAP = 1000  # the most seeds a configuration the rule looks for past the budget (N'); more: "more than CAP"
RATE_CAP = 100  # likewise for a rate (Fisher's exact power is costlier)
SEED = 0  # the simulation's seed: a decision is reproducible
MAX_DECISION_BYTES = 16 << 20  # a larger DECISION_FILE is not one (read no further)


@dataclass
class Decision:
    """One claim's seeds: ``seeds`` a configuration on its sides (``decided``: the target power there),
    ``power`` at it, ``needed``: the seeds that would reach the target (None: more than the cap; equal to
    ``seeds`` when decided), from the pilot's ``sd_a``/``sd_b`` (Welch, TOST) or b's ``rate_b`` (Fisher);
    ``unstable``: the pilot's unstable runs per side; ``false_positive``: the rule's simulated rate."""

    claim: str
    test: str
    pilot: int
    seeds: int
    budget: int
    power: float
    decided: bool
    needed: int | None
    effect: float
    level: float
    sd_a: float = math.nan
    sd_b: float = math.nan
    rate_b: float = math.nan
    unstable: str = ""
    false_positive: float = math.nan
    # when the pilot cannot size the claim, why: the budget is spent then (too few values, no spread, no effect),
    # or the pilot kept (a rate already at its bound: no count can show the claim's direction)
    why: str = ""
    configurations: list[str] = field(default_factory=list)

    def line(self) -> str:
        """What the report says of it."""
        spread = (
            f"b's pilot rate {_num(self.rate_b)}"
            if self.test == "fisher"
            else f"pilot SD a {_num(self.sd_a)}, b {_num(self.sd_b)} (stable runs)"
        )
        what = "margin" if self.test == "tost" else "effect"
        at = f"at the {what} {_num(self.effect)}, level {_num(self.level)}"
        if self.why:
            kept = "the pilot kept" if self.seeds == self.pilot else "the budget spent"
            head = f"inconclusive at {self.seeds} seeds ({kept}): {self.why}"
        elif self.decided:
            head = f"{self.seeds} seeds a configuration (power {self.power:.2f} {at})"
        else:
            more = f"{self.needed} would decide it" if self.needed else f"more than {_cap(self.test)} would"
            head = f"inconclusive at {self.seeds} seeds; {more} (power {self.power:.2f} {at})"
        fp = f"; false-positive rate {self.false_positive:.3f}" if not math.isnan(self.false_positive) else ""
        unstable = f"; unstable in the pilot: {self.unstable}" if self.unstable else ""
        return f"{self.claim}: {head}; {spread}{unstable}{fp}"


def rule_text(rule: SeedRule, fresh: int = FRESH) -> str:
    """The rule in words, with its numbers (the report states it beside the seeds it chose)."""
    return (
        f"Seeds by a rule fixed in advance (the grid's seeds:, docs/STUDY.md): the study trains each "
        f"configuration's first {rule.pilot} seeds (the pilot), then gives each claim's configurations the fewest "
        f"seeds a configuration at which the claim's test has a power of at least {rule.target:g} at its effect, at level "
        f"{ALPHA:g}/m (m claims: the strictest Holm asks), up to the seeds the grid lists (the budget). Power: "
        "Welch's one-sided test at the claim's effect (noncentral t), TOST's at no difference within the "
        "margin, Fisher's exact at a's rate the effect away from b's pilot rate. From the pilot's spreads "
        "only, never its differences: a side's SD over its stable pilot runs (a diverged or collapsed run is "
        "left out of the SD and counted as its own rate, so that a collapse does not inflate the spread). A "
        "configuration in several claims gets the most any asks; one in no claim keeps the pilot. A claim the "
        "budget cannot power reads inconclusive at the budget, with the seeds that would decide it. "
        f"False-positive rate: the share of {fresh:,} simulated studies with no true difference (normal runs at "
        "the pilot's SDs; a rate: both sides at the pilot's pooled rate; equivalence: a true difference at the "
        f"margin) in which the whole procedure (a pilot, the rule's seeds from it, the rest) ends with the claim's "
        f"test significant at {ALPHA:g} before Holm."
    )


def decide(
    runs: pd.DataFrame,
    audit: pd.DataFrame | None,
    claims: Sequence[Claim],
    rule: SeedRule,
    configuration: dict[str, str],
    budgets: dict[str, int],
    configs: dict[str, dict] | None = None,
    fresh: int = FRESH,
    pilot: set[str] | None = None,
) -> list[Decision]:
    """Each claim's ``Decision`` from the pilot's ``runs`` (a report's runs table; ``audit``:
    its audit table, for ``unbiased``; None: no claim filters on it). ``configuration``: run id -> its configuration (``grid.seeds``);
    ``budgets``: configuration -> the seeds the grid lists for it; ``configs``: run id -> flattened config, for
    filters on keys runs.csv lacks; ``pilot``: the pilot's run ids, when ``runs`` holds others too (the rule
    reads the pilot only, whatever was added since: a decision is the same on every rerun)."""
    from klsweep.report.audit_table import run_unbiased

    every = runs.assign(unbiased=run_unbiased(runs, audit)) if audit is not None else runs
    if pilot is not None:
        every = every[every["run"].isin(pilot)]
    done = every[finished(every)]
    level = ALPHA / max(1, len(claims))
    out = []
    for c in claims:
        sides = [claim_side(every, configs or {}, f) for f in (c.a, c.b)]
        groups = [sorted({configuration[r] for r in side["run"] if r in configuration}) for side in sides]
        budget = [[budgets[g] for g in group] for group in groups]
        chosen = [claim_side(done, configs or {}, f) for f in (c.a, c.b)]
        out.append(_decide(c, chosen, budget, rule, level, fresh))
        out[-1].configurations = sorted({*groups[0], *groups[1]})
    return out


def seeds_by_configuration(
    decisions: Sequence[Decision], budgets: dict[str, int], pilot: int
) -> dict[str, int]:
    """Configuration -> the seeds it trains: the most any claim it is in asks (never past its budget), the
    pilot for one in no claim."""
    seeds = dict.fromkeys(budgets, pilot)
    for d in decisions:
        for g in d.configurations:
            seeds[g] = max(seeds[g], min(d.seeds, budgets[g]))
    return {g: min(n, budgets[g]) for g, n in seeds.items()}


def _decide(
    c: Claim, sides: list[pd.DataFrame], budget: list[list[int]], rule: SeedRule, level: float, fresh: int
) -> Decision:
    """``decide`` for one claim: ``sides`` its finished pilot runs, ``budget`` each side's configurations'
    seeds in the grid."""
    top = max([*budget[0], *budget[1], rule.pilot])
    counts = "; ".join(
        f"{name} {int(unstable(s).sum())}/{len(s)}" for name, s in zip("ab", sides, strict=True)
    )
    base = {
        "claim": c.name,
        "test": c.test,
        "pilot": rule.pilot,
        "budget": top,
        "level": level,
        "unstable": counts if any(unstable(s).any() for s in sides) else "",
    }
    if not all(budget):
        return Decision(
            **base, seeds=top, power=math.nan, decided=False, needed=None, effect=math.nan,
            why="a side has no configuration in the grid",
        )  # fmt: skip
    power, model = _power_function(c, sides, level)
    if power is None:
        return Decision(
            **base, seeds=top, power=math.nan, decided=False, needed=None, effect=math.nan, why=model["why"]
        )
    sizes = _sizes(budget)
    if c.test == "fisher" and model["numbers"]["effect"] == 0:  # b's rate already at the bound: no count can
        rb = model["numbers"]["rate_b"]
        return Decision(
            **base, seeds=rule.pilot, power=0.0, decided=False, needed=None, effect=0.0, rate_b=rb,
            why=f"b's pilot rate is {_num(rb)}: no number of seeds can show a's {c.direction}",
        )  # fmt: skip
    for n in range(rule.pilot, top + 1):
        p = power(*sizes(n))
        if p >= rule.target:
            decision = Decision(**base, seeds=n, power=p, decided=True, needed=n, **model["numbers"])
            break
    else:
        p_top = power(*sizes(top))
        cap = RATE_CAP if c.test == "fisher" else CAP
        unbudgeted = _sizes([[cap] * len(budget[0]), [cap] * len(budget[1])])
        needed = next((n for n in range(top + 1, cap + 1) if power(*unbudgeted(n)) >= rule.target), None)
        decision = Decision(**base, seeds=top, power=p_top, decided=False, needed=needed, **model["numbers"])
    if fresh:
        decision.false_positive = _false_positive(c, model, budget, rule, level, fresh)
    return decision


def _sizes(budget: list[list[int]]) -> Any:
    """N seeds a configuration -> each side's runs (a configuration never past its budget)."""
    return lambda n: tuple(sum(min(n, b) for b in side) for side in budget)


def side_spread(side: pd.DataFrame, column: str) -> float:
    """A side's SD of ``column`` as the rule reads it (``_spread``): over its stable runs, collapses apart."""
    import pandas as pd

    values = pd.to_numeric(side[column], errors="coerce").to_numpy(float)
    return _spread(values, ~unstable(side).to_numpy(bool))


def _spread(values: Any, stable: Any) -> float:
    """A side's SD: over its stable runs (collapses apart), over all its runs when fewer than 2 are stable."""
    import numpy as np

    for x in (values[stable], values):
        x = x[~np.isnan(x)]
        if len(x) >= 2:
            return float(np.std(x, ddof=1))
    return math.nan


def _power_function(c: Claim, sides: list[pd.DataFrame], level: float) -> tuple[Any, dict[str, Any]]:
    """(power(n_a, n_b) of the claim's test at its effect, the pilot's numbers), or (None, {"why": ...})."""
    import numpy as np
    import pandas as pd

    a, b = sides
    if c.test == "fisher":
        rb = float(unstable(b).mean()) if len(b) else math.nan
        if c.metric != "unstable":
            rb = float(np.mean([str(v).lower() in ("true", "1", "1.0", "yes") for v in b[c.metric]]))
        if math.isnan(rb):
            return None, {"why": "side b has no finished pilot run"}
        ra = rate_at_effect(c, rb)
        numbers = {"effect": abs(ra - rb), "rate_b": rb}
        pooled = [unstable(s).to_numpy(float) for s in sides]
        model = {
            "numbers": numbers,
            "rate": (sum(x.sum() for x in pooled) + 0.5) / (sum(map(len, pooled)) + 1),
        }
        return (lambda na, nb: rate_power(*rate_power_args(c, na, nb, ra, rb), level)), model
    column = METRIC_COLUMNS.get(c.metric, c.metric)
    values = [pd.to_numeric(s[column], errors="coerce").to_numpy(float) for s in sides]
    sds = [_spread(x, ~unstable(s).to_numpy(bool)) for x, s in zip(values, sides, strict=True)]
    xb = values[1][~np.isnan(values[1])]
    if any(math.isnan(s) for s in sds):
        return None, {"why": "a side has fewer than 2 pilot values"}
    if not any(s > 0 for s in sds):
        return None, {"why": "the pilot's values do not vary"}
    if c.test == "tost":
        size = claim_size(c.margin, list(xb))
    else:
        size = claim_size(c.effect or DEFAULT_EFFECT.get(column), list(xb))
        if math.isnan(size):
            return None, {"why": f"no effect to size it at (effect:; {c.metric} has no default)"}
    model = {"numbers": {"effect": size, "sd_a": sds[0], "sd_b": sds[1]}, "sds": sds}
    return _continuous_power(c.test, sds, size, level), model


def _continuous_power(test: str, sds: list[float], size: float, level: float) -> Any:
    """power(n_a, n_b) of a Welch claim at the effect ``size``, or of a TOST claim within the margin ``size``,
    for sides of SDs ``sds``."""
    if test == "tost":
        return lambda na, nb: _tost_power(sds[0], na, sds[1], nb, size, level)
    return lambda na, nb: welch_power(_planned(sds[0], na, sds[1], nb), size, level)


def _planned(sd_a: float, n_a: int, sd_b: float, n_b: int) -> Welch:
    """A Welch test's spread and degrees of freedom for sides of these SDs and sizes (no data yet)."""
    va, vb = sd_a**2 / n_a, sd_b**2 / n_b
    se = math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va**2 / (n_a - 1) + vb**2 / (n_b - 1)) if se > 0 else math.nan
    return Welch(0.0, math.nan, 0.0, df, math.nan, n_a, n_b, se)


def _tost_power(sd_a: float, n_a: int, sd_b: float, n_b: int, margin: float, level: float) -> float:
    """The power of TOST at ``level`` to show equivalence within ``margin`` when the true difference is 0:
    P(|difference| < margin - t se), the difference's estimate t-distributed about 0."""
    from scipy.special import stdtr, stdtrit

    w = _planned(sd_a, n_a, sd_b, n_b)
    if not (w.se > 0 and w.df > 0):
        return math.nan
    reach = margin / w.se - float(stdtrit(w.df, 1 - level))
    return max(0.0, 2 * float(stdtr(w.df, reach)) - 1)


def _false_positive(
    c: Claim, model: dict[str, Any], budget: list[list[int]], rule: SeedRule, level: float, fresh: int
) -> float:
    """The share of ``fresh`` simulated studies with no true difference (``RULE_TEXT``) whose claim's test,
    through the whole procedure, reads p < ALPHA (before Holm)."""
    import numpy as np

    rng = np.random.default_rng(SEED)
    sizes = _sizes(budget)
    top = max([*budget[0], *budget[1], rule.pilot])
    first = sizes(rule.pilot)
    hits = 0
    for _ in range(fresh):
        if c.test == "fisher":
            rate = model["rate"]
            pilot = [rng.random(n) < rate for n in first]
            rb = float(pilot[1].mean())
            ra = rate_at_effect(c, rb)
            n = next(
                (k for k in range(rule.pilot, top + 1)
                 if rate_power(*rate_power_args(c, *sizes(k), ra, rb), level) >= rule.target),
                top,
            )  # fmt: skip
            runs = [
                np.concatenate([p, rng.random(m - len(p)) < rate])
                for p, m in zip(pilot, sizes(n), strict=True)
            ]
            a, b = (int(x.sum()) for x in runs)
            na, nb = (len(x) for x in runs)
            p, _ = rate_test(*((a, na, b, nb) if c.direction == "greater" else (b, nb, a, na)))
        else:
            sds = model["sds"]
            shift = model["numbers"]["effect"] if c.test == "tost" else 0.0  # equivalence: at the margin
            pilot = [rng.normal(0.0, s, m) for s, m in zip(sds, first, strict=True)]
            pilot[0] = pilot[0] + shift
            est = [float(np.std(x, ddof=1)) for x in pilot]
            power = _continuous_power(c.test, est, model["numbers"]["effect"], level)
            n = next((k for k in range(rule.pilot, top + 1) if power(*sizes(k)) >= rule.target), top)
            more = [rng.normal(0.0, s, m - len(p)) for s, p, m in zip(sds, pilot, sizes(n), strict=True)]
            more[0] = more[0] + shift
            a, b = (np.concatenate(pair) for pair in zip(pilot, more, strict=True))
            if c.test == "tost":
                p, _ = tost_of(welch(list(a), list(b)), model["numbers"]["effect"])
            else:
                p = welch(list(a), list(b), alternative=c.direction).p
        hits += p < ALPHA
    return hits / fresh


def _cap(test: str) -> int:
    return RATE_CAP if test == "fisher" else CAP


def _num(v: float) -> str:
    return "—" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.3g}"


# The decision beside the sweep: written by the study, read by the report (a file it did not write: checked).
def write_decision(
    sweep_dir: str | Path,
    rule: SeedRule,
    decisions: Sequence[Decision],
    seeds: dict[str, int],
    name: Callable[[str], str] = str,
) -> Path:
    """``DECISION_FILE`` in the sweep folder: the rule, each claim's decision, each configuration's seeds
    (``name``: a configuration as the file shows it)."""
    from klsweep import store

    rows = [_jsonable(asdict(d) | {"configurations": [name(c) for c in d.configurations]}) for d in decisions]
    data = {
        "rule": rule_text(rule),
        "pilot": rule.pilot,
        "target": rule.target,
        "claims": rows,
        "lines": [d.line() for d in decisions],
        "seeds": {name(c): n for c, n in seeds.items()},
    }
    path = Path(sweep_dir) / DECISION_FILE
    store.atomic_write_text(path, json.dumps(data, indent=1, allow_nan=False) + "\n")
    return path


def _jsonable(row: dict[str, Any]) -> dict[str, Any]:
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in row.items()}


def read_decision(sweep_dir: str | Path) -> tuple[list[str], list[dict[str, Any]]] | None:
    """(the rule and each claim's line, each claim's numbers) of the sweep's ``DECISION_FILE``; None without
    one. ``ValueError`` (its message says why) when it is not one this module wrote: not JSON, or not its
    shape."""
    from klsweep import store

    path = Path(sweep_dir) / DECISION_FILE
    try:
        data = json.loads(store.read_bytes(path, limit=MAX_DECISION_BYTES))
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError, ValueError, store.UnreadableFile) as e:
        raise ValueError(f"{path}: not readable ({e})") from e
    lines = data.get("lines") if isinstance(data, dict) else None
    rows = data.get("claims") if isinstance(data, dict) else None
    rule = data.get("rule") if isinstance(data, dict) else None
    if not (
        isinstance(rule, str)
        and isinstance(lines, list)
        and all(isinstance(x, str) for x in lines)
        and isinstance(rows, list)
        and all(
            isinstance(r, dict)
            and all(isinstance(v, str | int | float | bool | type(None) | list) for v in r.values())
            for r in rows
        )
    ):
        raise ValueError(f"{path}: not a seed rule's decision (klsweep study writes it)")
    return [rule, *lines], rows


def write_table(out_dir: str | Path, rows: list[dict[str, Any]] | None) -> list[Path]:
    """``seeds.csv`` in the report folder: each claim's decision (``Decision``'s fields); with no decision
    (``rows`` None), a stale one removed."""
    import pandas as pd

    from klsweep import store
    from klsweep.report.tables import csv_cell

    path = Path(out_dir) / "seeds.csv"
    if rows is None:
        path.unlink(missing_ok=True)
        return []
    table = pd.DataFrame(rows, columns=[f.name for f in fields(Decision)])
    table["configurations"] = table["configurations"].map(lambda v: "; ".join(map(str, v or [])))
    store.atomic_write_text(path, table.map(csv_cell).to_csv(index=False))
    return [path]
