"""Training that hurts is said (issue 41): the Δ from the step-0 model is paired on the problems with the
step-0 model's own outcomes (one greedy eval of the same problems, not an exact number), the terminal keeps the
Δ columns when it is narrow, and a configuration whose Δ in-domain interval lies wholly below 0 gets a warning
line in report.md, report.html and the terminal: a loud one for a no-KL baseline (its learning rate or batch
is suspect)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import sweepgen
from clitools import render

from klsweep import report as rp
from klsweep import store
from klsweep.report.data import D_ID, D_OOD, ID_AVG
from klsweep.report.tables import BY_PROBLEMS, BY_SEEDS, CI_METHOD

TASKS = ("tiny_add", "tiny_sub", "tiny_rev")
PROBLEMS = 100


def write_outcomes(folder: Path, outcomes: dict[str, np.ndarray]) -> None:
    """An eval folder's per-problem outcomes as lm-eval writes them (``samples_<task>.jsonl``), and its
    results.json's accuracies made their means."""
    res = json.loads((folder / "results.json").read_text())
    for task, scores in outcomes.items():
        rows = [{"doc_id": j, "filter": "none", "exact_match": float(v)} for j, v in enumerate(scores)]
        (folder / f"samples_{task}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        kind = "in_domain" if task == "tiny_add" else "ood"
        res["metrics"][kind][task] = float(np.mean(scores))
    store.write_json(folder / "results.json", res)


def eval_folder(run: Path) -> Path:
    (folder,) = (run / store.EVAL_DIR / sweepgen.HASH).iterdir()
    return folder


@pytest.fixture
def sweep(tmp_path: Path) -> Path:
    """Three configurations of 3 seeds, 100 problems a task; the step-0 model answers 58 of 100 additions.
    k1 in the reward: every seed answers as the step-0 model but for 6 problems lost and 3 won (Δ −0.03, the
    same in each seed: over seeds alone an interval of width 0, wholly below 0). k3 in the loss: 15 of the
    step-0 model's right answers lost, a few more or fewer per seed. No KL: 30 lost."""
    grid = [
        {"kl.estimator": "k1", "kl.placement": "reward", "kl.beta": 1.0},
        {"kl.estimator": "k3", "kl.placement": "loss", "kl.beta": 1.0},
        {"kl.beta": 0.0},
    ]
    sweep = sweepgen.write_sweep(tmp_path / "hurt", grid, seeds=3, steps=20)
    rng = np.random.default_rng(0)
    step0 = {t: (rng.random(PROBLEMS) < 0.5).astype(float) for t in TASKS}
    right, wrong = np.flatnonzero(step0["tiny_add"] == 1), np.flatnonzero(step0["tiny_add"] == 0)
    step0["tiny_add"][:] = 0
    step0["tiny_add"][rng.choice(PROBLEMS, 58, replace=False)] = 1
    right, wrong = np.flatnonzero(step0["tiny_add"] == 1), np.flatnonzero(step0["tiny_add"] == 0)
    (base,) = (sweep / store.BASELINE_DIR).iterdir()
    write_outcomes(eval_folder(base), step0)
    for run in (d for d in sweep.iterdir() if (d / store.CONFIG_FILE).is_file()):
        config = (run / store.CONFIG_FILE).read_text()
        seed = int(next(line for line in config.splitlines() if line.startswith("seed:")).split()[1])
        add = step0["tiny_add"].copy()
        if "beta: 0.0" in config:
            add[right[: 30 + seed]] = 0
        elif "placement: loss" in config:
            add[right[: 14 + seed]] = 0
        else:
            add[right[:6]], add[wrong[:3]] = 0, 1
        write_outcomes(eval_folder(run), {**step0, "tiny_add": add})
    return sweep


def test_the_step0_delta_is_paired_on_the_problems(sweep: Path, tmp_path: Path) -> None:
    r = rp.build_report(sweep, tmp_path / "r", formats=("csv",), wandb=False)
    main = r.main.set_index("placement")
    k1 = main.loc["reward"]
    assert k1[D_ID] == pytest.approx(-0.03)
    assert k1[f"{D_ID} {CI_METHOD}"] == BY_PROBLEMS and k1[f"{D_OOD} {CI_METHOD}"] == BY_PROBLEMS
    # the seeds agree, but 9 problems of 100 differ from the step-0 model's answers: which problems the eval
    # drew is noise of the difference (about ±0.06), where over seeds alone the interval had no width
    assert k1[f"{D_ID} low"] < 0 < k1[f"{D_ID} high"]
    assert 0.03 < k1[f"{D_ID} ci"] < 0.1
    assert k1[f"{D_OOD} low"] == pytest.approx(0, abs=1e-9) == k1[f"{D_OOD} high"]  # the step-0 answers
    no_kl = main.loc["no KL"]
    assert no_kl[f"{D_ID} high"] < 0 and no_kl[D_ID] == pytest.approx(-0.31)
    csv = (tmp_path / "r" / "main.csv").read_text().splitlines()[0]
    assert f"{D_ID} low" in csv and f"{D_ID} {CI_METHOD}" in csv


def test_without_the_step0_models_outcomes_the_delta_is_over_seeds_and_says_so(sweep: Path, tmp_path: Path):
    (base,) = (sweep / store.BASELINE_DIR).iterdir()
    (eval_folder(base) / "samples_tiny_add.jsonl").unlink()
    r = rp.build_report(sweep, tmp_path / "r", formats=("csv",), wandb=False)
    assert set(r.main[f"{D_ID} {CI_METHOD}"]) == {BY_SEEDS}
    assert set(r.main[f"{ID_AVG} {CI_METHOD}"]) == {BY_PROBLEMS}  # the runs' own intervals need no step 0
    (note,) = [m for m in r.missing if "step-0" in m]
    assert base.name in note and "over seeds only" in note


def test_a_configuration_below_its_step0_model_is_warned_of_everywhere(sweep: Path, tmp_path: Path) -> None:
    r = rp.build_report(sweep, tmp_path / "r", formats=("md", "html"), wandb=False)
    md = (tmp_path / "r" / "report.md").read_text()
    html = (tmp_path / "r" / "report.html").read_text()
    term = " ".join(render(*rp.rich_tables(r, width=80), width=80).split())
    # no KL: loud, naming what is suspect; k3 in the loss: a warning; k1 in the reward (interval over 0): none
    for text in (md, html, term):
        flat = " ".join(text.replace("<b>", "").replace("</b>", "").replace("**", "").split())
        assert (
            "WARNING: the no-KL baseline ends below its step-0 model in domain (Δ in-domain -0.310, 95% CI"
            in flat
        ), flat[:3000]
        assert "learning rate or batch is suspect" in flat
        assert "Warning: k3 in loss ends below its step-0 model in domain" in flat
        assert "k1 in reward ends below" not in flat
    assert '<p class="alarm">' in html and '<p class="warning">' in html


def test_a_sweep_that_helps_has_no_warning(sweep: Path, tmp_path: Path) -> None:
    (base,) = (sweep / store.BASELINE_DIR).iterdir()
    write_outcomes(eval_folder(base), {"tiny_add": np.zeros(PROBLEMS)})
    r = rp.build_report(sweep, tmp_path / "r", formats=("md",), wandb=False)
    assert (r.main[f"{D_ID} low"] > 0).all()
    assert "Warning" not in (tmp_path / "r" / "report.md").read_text()
    assert "Warning" not in render(*rp.rich_tables(r, width=80), width=80)


def test_a_narrow_terminal_keeps_the_delta_columns(tmp_path: Path) -> None:
    """Four configuration axes (sweeps/tiny.yaml's): at 80 columns the Δ columns stay; n and the averages
    (the step-0 scores are in the caption) go first, and the caption says so."""
    sweep = sweepgen.write_sweep(tmp_path / "wide", sweepgen.tiny_grid(), seeds=2, steps=20)
    r = rp.build_report(sweep, tmp_path / "r", formats=("md",), wandb=False)
    out = render(*rp.rich_tables(r, width=80), width=80)
    assert max(len(line) for line in out.splitlines()) <= 80, out
    results = out.split(r.sweep_dir.name)[1]
    assert "Δ in-domain" in " ".join(results.split()) and "Δ OOD" in results
    assert "not shown at 80 columns: n" in " ".join(out.split())
