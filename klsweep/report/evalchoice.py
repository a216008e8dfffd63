"""Which eval a report shows: one eval set, chosen the same way every time, and said.

A sweep's runs can hold results of several evals (``eval/<hash>/``: the grid's chained eval, a later
``klsweep eval --suite ...``). The report never takes "the newest present": it shows the eval ``--eval-hash``
asks for, else the one the runs' grid names (its settings, ``eval.limit`` included), else the only one present;
``EvalChoice.note`` says how it was chosen when that is not the grid's own, and names the others present.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from klsweep.errors import UserError
from klsweep.evaluate import as_eval_section, eval_hash, eval_label, eval_settings
from klsweep.printable import counted


@dataclass
class Present:
    """One eval present in the sweep: its settings (from a results.json) and how many runs it scored."""

    settings: dict[str, Any]
    runs: set[str] = field(default_factory=set)


@dataclass
class EvalChoice:
    """The eval a report shows (None: none), in words (``evaluate.eval_label``), and how it was chosen when
    not as the grid says."""

    hash: str | None
    label: str
    note: str = ""


def _norm(settings: dict[str, Any]) -> str:
    return json.dumps(settings, sort_keys=True, default=str)


def grid_evals(configs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The distinct eval settings (``evaluate.eval_settings``) the runs' configs (flattened) name; a run whose
    grid chained no eval (``eval: none``) names none. The flattened configs keep lists as JSON text."""
    seen: dict[str, dict[str, Any]] = {}
    for config in configs:
        section = {
            k.removeprefix("eval."): json.loads(v) if isinstance(v, str) and v[:1] in "[{" else v
            for k, v in config.items()
            if k.startswith("eval.")
        }
        if section.get("suite", "none") == "none":
            continue
        key = _norm(section)
        if key not in seen:
            from omegaconf.errors import OmegaConfBaseException  # only a grid with an eval reads one

            try:
                seen[key] = eval_settings(as_eval_section(section))
            except (
                UserError,
                ValueError,
                OmegaConfBaseException,
            ):  # settings klsweep can no longer read: the grid's eval cannot be named
                continue
    unique = {_norm(s): s for s in seen.values()}
    return list(unique.values())


def _others(present: dict[str, Present], chosen: str | None, sweep: str) -> str:
    rest = sorted(h for h in present if h != chosen)
    if not rest:
        return ""
    listed = "; ".join(
        f"{h} ({eval_label(present[h].settings, h)}, {counted(len(present[h].runs), 'run')})" for h in rest
    )
    return f"also present, not shown: {listed} (`klsweep report {sweep} --eval-hash HASH` shows one)"


def choose_eval(
    present: dict[str, Present], asked: str | None, grid: list[dict[str, Any]], sweep: str
) -> EvalChoice:
    """The eval to report (``present``: the evals of the runs' results by hash; ``asked``: ``--eval-hash``,
    already checked to exist; ``grid``: ``grid_evals``). The grid's eval when it names one, even when no run
    has been scored with it yet (then no scores, said, rather than another eval's in their place)."""
    if asked is not None:
        settings = present[asked].settings if asked in present else {}
        label = eval_label(settings, asked) if settings else f"eval {asked}"
        return EvalChoice(
            asked,
            label,
            "; ".join(filter(None, ["the one --eval-hash asks for", _others(present, asked, sweep)])),
        )
    if len(grid) == 1:
        want = _norm(grid[0])
        current = eval_hash(grid[0])
        matching = [h for h in present if h == current or _norm(present[h].settings) == want]
        if not matching:
            note = f"no run has been scored with the grid's eval yet (`klsweep eval {sweep}` scores them)"
            return EvalChoice(
                current,
                eval_label(grid[0], current),
                "; ".join(filter(None, [note, _others(present, current, sweep)])),
            )
        # the same settings under several hashes (lm-eval upgraded between evals): this lm-eval's, else the most runs
        chosen = current if current in matching else max(matching, key=lambda h: (len(present[h].runs), h))
        return EvalChoice(chosen, eval_label(grid[0], chosen), _others(present, chosen, sweep))
    why = "the runs' grid names no eval" if not grid else "the runs' grids name different evals"
    if len(present) == 1:
        (only,) = present
        return EvalChoice(only, eval_label(present[only].settings, only), f"{why}: the only eval present")
    if not present:
        return EvalChoice(None, eval_label({}, None))
    return EvalChoice(
        None,
        eval_label({}, None),
        f"{why} and several are present: none shown; {_others(present, None, sweep)}",
    )
