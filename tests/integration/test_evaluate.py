"""klsweep.evaluate with real lm-eval on the project's tiny models: the results contract, skip on repeat, a new
hash after a settings change, broken checkpoints, the step-0 baseline, the paper suite's task names, and that
the metric tells a trained model from a random one."""

from __future__ import annotations

import json
import shutil
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from klsweep import evaluate as ev
from klsweep import store
from klsweep.config import EvalSection, ModelSection
from klsweep.errors import UserError
from klsweep.evaluate import running
from klsweep.submit import submit_eval

CONTRACT_KEYS = {
    "suite",
    "eval_hash",
    "checkpoint",
    "step",
    "backend",
    "metric",
    "metrics",
    "stderr",
    "settings",
    "lm_eval_version",
    "created_at",
}
TINY_TASKS = ["tiny_add", "tiny_sub", "tiny_rev"]


@pytest.fixture(scope="module")
def random_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from klsweep.tinymodel import random_tiny_model

    return random_tiny_model(tmp_path_factory.mktemp("models") / "random")


@pytest.fixture
def tiny(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> EvalSection:
    monkeypatch.chdir(tmp_path)  # the shipped task data must not depend on the working directory
    return replace(ev.load_suite("tiny"), limit=8)


def make_run(
    sweep: Path,
    name: str,
    model: Path,
    steps: tuple[int, ...] = (10,),
    state: str = "done",
    eval_cfg: dict | None = None,
) -> Path:
    run = sweep / name
    for step in steps:
        shutil.copytree(model, run / store.CHECKPOINTS_DIR / f"checkpoint-{step}")
    config = {
        "name": sweep.name,
        "model": {"name": "tiny", "path": str(model)},
        **({"eval": eval_cfg} if eval_cfg else {}),
    }
    store.atomic_write_text(run / store.CONFIG_FILE, OmegaConf.to_yaml(OmegaConf.create(config)))
    store.write_status(run, state, step=max(steps, default=0))
    return run


def test_results_follow_the_contract(tmp_path: Path, random_model: Path, tiny: EvalSection) -> None:
    run = make_run(tmp_path / "sweep", "run-a", random_model, steps=(5, 10))
    (path,) = ev.eval_run(run, tiny)
    h = ev.eval_hash(ev.eval_settings(tiny))
    assert path == run / "eval" / h / "checkpoint-10" / "results.json"
    res = json.loads(path.read_text())
    assert set(res) >= CONTRACT_KEYS
    assert res["suite"] == "tiny" and res["eval_hash"] == h and res["checkpoint"] == "checkpoint-10"
    assert res["step"] == 10 and res["backend"] == "hf" and res["metric"] == "exact_match"
    assert set(res["metrics"]) == {"in_domain", "ood"}
    assert set(res["metrics"]["in_domain"]) == {"tiny_add"}
    assert set(res["metrics"]["ood"]) == {"tiny_sub", "tiny_rev"}
    assert set(res["stderr"]) == set(TINY_TASKS)
    assert all(0.0 <= v <= 1.0 for part in res["metrics"].values() for v in part.values())
    assert res["settings"] == ev.eval_settings(tiny)
    assert res["lm_eval_version"] == ev.lm_eval_version()
    assert res["num_problems"] == dict.fromkeys(TINY_TASKS, 8)
    assert res["final_state"] is None  # no marker: not known to be where its run ended
    for task in TINY_TASKS:
        rows = store.read_jsonl(path.parent / f"samples_{task}.jsonl")
        assert len(rows) == 8 and {"doc", "resps", "filtered_resps", "exact_match"} <= set(rows[0])
    # the chat template wrapped the question exactly as the training prompts are
    add = store.read_jsonl(path.parent / "samples_tiny_add.jsonl")[0]
    assert add["arguments"][0][0] == add["doc"]["prompt"]
    assert "vllm" not in sys.modules
    # --checkpoints all adds the earlier checkpoint beside the last
    assert [p.parent.name for p in ev.eval_run(run, tiny, checkpoints="all")] == [
        "checkpoint-5",
        "checkpoint-10",
    ]


def test_chat_template_is_the_models_training_decision(
    tmp_path: Path, random_model: Path, tiny: EvalSection
) -> None:
    """The suite's apply_chat_template null: each model is evaluated as it was trained (model.chat_template)."""
    assert tiny.apply_chat_template is None
    for chat in (True, False):
        run = make_run(tmp_path / "sweep", f"chat-{chat}", random_model)
        config = OmegaConf.load(run / store.CONFIG_FILE)
        config.model.chat_template = chat
        store.atomic_write_text(run / store.CONFIG_FILE, OmegaConf.to_yaml(config))
        (path,) = ev.eval_run(run, replace(tiny, limit=2))
        assert json.loads(path.read_text())["chat_template_applied"] is chat
        add = store.read_jsonl(path.parent / "samples_tiny_add.jsonl")[0]
        assert add["arguments"][0][0] == (add["doc"]["prompt"] if chat else add["doc"]["question"])


def test_repeat_is_skipped_and_changed_settings_get_a_new_hash(
    tmp_path: Path, random_model: Path, tiny: EvalSection, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = make_run(tmp_path / "sweep", "run-a", random_model)
    (first,) = ev.eval_run(run, tiny)
    mtime = first.stat().st_mtime_ns

    calls = []
    real = running.evaluate_item
    monkeypatch.setattr(running, "evaluate_item", lambda item, suite: calls.append(item) or real(item, suite))
    assert ev.eval_run(run, tiny) == [first]
    assert calls == [] and first.stat().st_mtime_ns == mtime

    (second,) = ev.eval_run(run, replace(tiny, max_gen_toks=6))
    assert len(calls) == 1
    assert second.parent.parent.name != first.parent.parent.name
    assert first.is_file() and first.stat().st_mtime_ns == mtime  # the old results are kept
    assert json.loads(second.read_text())["settings"]["max_gen_toks"] == 6
    # batch size does not change a score: same hash
    assert ev.eval_hash(ev.eval_settings(replace(tiny, batch_size=3))) == ev.eval_hash(ev.eval_settings(tiny))


def test_broken_checkpoint_is_recorded_and_others_go_on(
    tmp_path: Path, random_model: Path, tiny: EvalSection
) -> None:
    sweep = tmp_path / "sweep"
    good = make_run(sweep, "good", random_model)
    bad = make_run(sweep, "bad", random_model)
    empty = make_run(sweep, "empty", random_model, steps=())
    weights = next((bad / "checkpoints" / "checkpoint-10").glob("*.safetensors"))
    weights.write_bytes(b"not a safetensors file")

    paths = ev.eval_many([bad, empty, good], tiny)
    h = ev.eval_hash(ev.eval_settings(tiny))
    assert paths == [good / "eval" / h / "checkpoint-10" / "results.json"]
    err = json.loads((bad / "eval" / h / "error.json").read_text())
    assert "checkpoint-10" in err["error"] and err["traceback"]
    assert store.read_status(bad)["eval_error"] == err["error"]
    assert store.read_status(bad)["state"] == "done"  # the run's own state is untouched
    assert "no complete checkpoint" in store.read_status(empty)["eval_error"]
    with pytest.raises(ev.EvalError, match="checkpoint-10"):
        ev.eval_run(bad, tiny)

    # fixed: the error is cleared
    shutil.rmtree(bad / "checkpoints" / "checkpoint-10")
    shutil.copytree(random_model, bad / "checkpoints" / "checkpoint-10")
    ev.eval_run(bad, tiny)
    assert not (bad / "eval" / h / "error.json").exists()
    assert store.read_status(bad)["eval_error"] is None


def test_baseline_is_step_0(tmp_path: Path, random_model: Path, tiny: EvalSection) -> None:
    sweep = tmp_path / "sweep"
    model = ModelSection(name="tiny", path=str(random_model))
    path = ev.eval_baseline(sweep, model, tiny)
    h = ev.eval_hash(ev.eval_settings(tiny))
    assert path == sweep / "baseline" / "tiny" / "eval" / h / "step-0" / "results.json"
    res = json.loads(path.read_text())
    assert res["checkpoint"] == "step-0" and res["step"] == 0
    assert (sweep / "baseline" / "tiny" / "config.yaml").is_file()
    mtime = path.stat().st_mtime_ns
    assert ev.eval_baseline(sweep, model, tiny) == path and path.stat().st_mtime_ns == mtime


def test_evaluate_a_sweep_in_process(
    tmp_path: Path, random_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sweep = tmp_path / "sweep"
    done = make_run(sweep, "done-run", random_model)
    diverged = make_run(sweep, "diverged-run", random_model, state="diverged")
    make_run(sweep, "running-run", random_model, state="running")
    base = ev.load_suite("tiny")
    monkeypatch.setattr(ev, "load_suite", lambda name, config_dirs=(): replace(base, limit=4))
    out = submit_eval(sweep, suite="tiny", cluster="debug")
    h = ev.eval_hash(ev.eval_settings(replace(base, limit=4)))
    assert sorted(out.results) == sorted(
        [
            sweep / "baseline" / "tiny" / "eval" / h / "step-0" / "results.json",
            done / "eval" / h / "checkpoint-10" / "results.json",
            diverged / "eval" / h / "checkpoint-10" / "results.json",
        ]
    )
    assert out.errors == {} and list(out.skipped.values()) == ["running"]


def test_eval_uses_the_grids_settings_and_takes_overrides(
    tmp_path: Path, random_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The grid's eval.limit (in each run's config) is kept by `klsweep eval SWEEP` and by `--suite` of the
    same suite (it scored the suite file's 64 problems per task), and eval.KEY=VALUE overrides change it."""
    from dataclasses import asdict

    monkeypatch.chdir(tmp_path)
    grids = replace(ev.load_suite("tiny"), limit=3)
    sweep = tmp_path / "sweep"
    run = make_run(sweep, "run-a", random_model, eval_cfg=asdict(grids))
    settings = ev.eval_settings(grids)
    for suite in (None, "tiny"):  # the second: the same settings, scored already, nothing evaluated again
        out = submit_eval(sweep, suite=suite, cluster="debug")
        assert out.errors == {}
        h = ev.eval_hash(settings)
        found = run / "eval" / h / "checkpoint-10" / "results.json"
        assert found in out.results if suite is None else (found in out.scored and out.nothing_left)
        assert out.eval == f"suite tiny, 3 problems per task, eval {h}"
    res = store.read_json(run / "eval" / h / "checkpoint-10" / "results.json")
    assert set(res["num_problems"].values()) == {3}
    out = submit_eval(sweep, cluster="debug", overrides=["eval.limit=2", "eval.ood=[tiny_sub]"])
    h2 = ev.eval_hash(ev.eval_settings(replace(grids, limit=2, ood=["tiny_sub"])))
    res = store.read_json(run / "eval" / h2 / "checkpoint-10" / "results.json")
    assert res["num_problems"] == {"tiny_add": 2, "tiny_sub": 2} and h2 != h
    with pytest.raises(UserError) as e:
        submit_eval(sweep, cluster="debug", overrides=["limit=2", "eval.limit=many", "eval.suite=paper"])
    said = str(e.value)
    assert "limit=2" in said and "eval.limit=many" in said and "--suite NAME" in said


def test_cli_eval_one_run(tmp_path: Path, random_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from klsweep.cli import app

    run = make_run(tmp_path / "sweep", "run-a", random_model)
    base = ev.load_suite("tiny")
    monkeypatch.setattr(ev, "load_suite", lambda name, config_dirs=(): replace(base, limit=4))
    result = CliRunner().invoke(app, ["eval", str(run), "--suite", "tiny", "--cluster", "debug"])
    assert result.exit_code == 0, result.output
    scores = " ".join(result.output.split())  # the scores table, as lm-eval prints one
    assert "run-a checkpoint-10" in scores and "tiny_add" in scores and "tiny_sub" in scores, result.output
    bad = CliRunner().invoke(app, ["eval", str(run), "--suite", "tiny", "--cluster", "moon"])
    assert bad.exit_code != 0 and isinstance(bad.exception, UserError)


def test_sampled_pass_at_1(tmp_path: Path, random_model: Path, tiny: EvalSection) -> None:
    run = make_run(tmp_path / "sweep", "run-a", random_model)
    cfg = replace(tiny, limit=4, temperature=1.0, num_samples=2)
    (path,) = ev.eval_run(run, cfg)
    rows = store.read_jsonl(path.parent / "samples_tiny_add.jsonl")
    assert sorted({r["sample_index"] for r in rows}) == [0, 1] and len(rows) == 8
    assert json.loads(path.read_text())["num_problems"]["tiny_add"] == 4


def test_invalid_settings_are_user_errors() -> None:
    with pytest.raises(UserError, match="no eval suite 'moon'"):
        ev.load_suite("moon")
    with pytest.raises(UserError, match="no lm-eval task 'tiny_mul'"):
        ev.resolve_tasks(replace(ev.load_suite("tiny"), ood=["tiny_mul"]))
    with pytest.raises(UserError, match="temperature > 0"):
        ev.as_eval_section(replace(ev.load_suite("tiny"), num_samples=4))
    with pytest.raises(UserError, match="names no tasks"):
        ev.as_eval_section(ev.load_suite("none"))


def test_paper_suite_resolves_to_existing_tasks() -> None:
    """Index only, no download: every task of the paper suite exists, on the datasets of lm-eval's own
    MATH-500 and MMLU tasks; the answer checks work on made-up completions."""
    import lm_eval
    import yaml

    cfg = ev.load_suite("paper")
    assert cfg.in_domain == ["klsweep_math500"]
    assert cfg.ood == [f"klsweep_mmlu_college_{s}" for s in ("physics", "chemistry", "biology")]
    found = ev.resolve_tasks(cfg)
    assert set(found) == {*cfg.in_domain, *cfg.ood}

    builtin = Path(lm_eval.__file__).parent / "tasks"
    math500 = yaml.safe_load((builtin / "minerva_math" / "minerva_math500.yaml").read_text())
    mmlu = yaml.safe_load((builtin / "mmlu" / "generative" / "_default_template_yaml").read_text())
    from lm_eval.tasks._yaml_loader import load_yaml

    ours = {name: load_yaml(path, resolve_func=True) for name, path in found.items()}
    assert ours["klsweep_math500"]["dataset_path"] == math500["dataset_path"] == "HuggingFaceH4/MATH-500"
    for s in ("physics", "chemistry", "biology"):
        task = ours[f"klsweep_mmlu_college_{s}"]
        assert task["dataset_path"] == mmlu["dataset_path"] == "cais/mmlu"
        assert task["dataset_name"] == f"college_{s}" and task["test_split"] == "test"

    score = ours["klsweep_math500"]["process_results"]
    assert score({"answer": "\\frac{1}{2}"}, ["so x = 0.5, i.e. $\\boxed{\\frac12}$"])["exact_match"] == 1
    assert score({"answer": "\\frac{1}{2}"}, ["$\\boxed{2}$"])["exact_match"] == 0
    (chain,) = ours["klsweep_mmlu_college_physics"]["filter_list"]  # one score per task
    letters = chain["filter"][0]["filter_fn"]
    text = "First \\boxed{A} was wrong; the answer is \\boxed{\\text{(C)}}."
    assert letters([[text]], [{}]) == [["C"]]


@pytest.mark.slow
def test_trained_model_scores_differently_from_random(tmp_path: Path, random_model: Path) -> None:
    from klsweep.tinymodel import tiny_model_path

    cfg = replace(ev.load_suite("tiny"), limit=32)
    sweep = tmp_path / "sweep"
    trained = make_run(sweep, "trained", tiny_model_path())
    untrained = make_run(sweep, "random", random_model)
    scores = {}
    for path in ev.eval_many([trained, untrained], cfg):
        res = json.loads(path.read_text())
        scores[path.parts[-5]] = {**res["metrics"]["in_domain"], **res["metrics"]["ood"]}
    assert set(scores["random"].values()) == {0.0}
    # the warm start teaches each skill part of the way (how far differs by skill): some score is well above 0
    assert max(scores["trained"].values()) >= 0.2, scores


@pytest.mark.slow
def test_evaluate_a_sweep_as_a_local_job(
    tmp_path: Path, random_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sweep = tmp_path / "sweep"
    run = make_run(sweep, "done-run", random_model)
    base = ev.load_suite("tiny")
    monkeypatch.setattr(ev, "load_suite", lambda name, config_dirs=(): replace(base, limit=4))
    out = submit_eval(sweep, suite="tiny", cluster="local", wait=True)
    h = ev.eval_hash(ev.eval_settings(replace(base, limit=4)))
    assert len(out.jobs) == 1 and out.errors == {}
    assert run / "eval" / h / "checkpoint-10" / "results.json" in out.results
    rows = store.read_jsonl(sweep / store.JOBS_FILE)
    assert {(r["run_id"], r["kind"], r["job_id"]) for r in rows} == {
        ("done-run", "eval", out.jobs[0]),
        ("baseline", "eval", out.jobs[0]),
    }


@pytest.mark.slow
def test_local_eval_split_over_jobs_gives_the_results_of_one_process(
    tmp_path: Path, random_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Greedy eval: the runs dealt to two local jobs (side by side) score as they do in one process."""
    from klsweep.environment import usable_cores
    from klsweep.tinymodel import tiny_model_path

    base = ev.load_suite("tiny")
    monkeypatch.setattr(ev, "load_suite", lambda name, config_dirs=(): replace(base, limit=6))
    sweeps = {}
    for how in ("split", "one"):
        sweeps[how] = tmp_path / how / "sweep"
        make_run(sweeps[how], "trained", tiny_model_path())
        make_run(sweeps[how], "random", random_model)
    split = submit_eval(sweeps["split"], suite="tiny", cluster="local", wait=True, jobs=2)
    one = submit_eval(sweeps["one"], suite="tiny", cluster="debug")
    assert split.errors == {} and one.errors == {}
    assert len(set(split.jobs)) == 2
    rows = store.read_jsonl(sweeps["split"] / store.JOBS_FILE)
    by_run = {r["run_id"]: r["job_id"] for r in rows}
    assert set(by_run) == {"trained", "random", "baseline"} and by_run["trained"] != by_run["random"]

    def metrics(out: ev.EvalOutcome, sweep: Path) -> dict[str, dict]:
        found = {}
        for p in out.results:
            res = json.loads(Path(p).read_text())
            found[str(Path(p).relative_to(sweep))] = (res["metrics"], res["stderr"])
        return found

    got, want = metrics(split, sweeps["split"]), metrics(one, sweeps["one"])
    assert len(want) == 3 and got == want
    # each job on its share of the cores: torch's default (every core) oversubscribed the machine, 2.4 s an
    # eval of the tiny study against 0.7 (environment.use_cpu_threads)
    threads = {json.loads(Path(p).read_text())["cpu_threads"] for p in split.results}
    assert threads == {max(1, usable_cores() // 2)}, threads
    assert max(v for m, _ in want.values() for part in m.values() for v in part.values()) > 0


def test_shipped_tiny_data_is_current(tmp_path: Path) -> None:
    """The jsonl files shipped in klsweep/evaltasks/tiny/ are what klsweep.tasks writes today. To refresh:
    python -c "from pathlib import Path; from klsweep.tasks import write_eval_data as w; w(Path('klsweep/evaltasks/tiny'))"
    """
    from klsweep.tasks import write_eval_data

    fresh = write_eval_data(tmp_path)
    shipped = ev.TASKS_DIR / "tiny"
    for name, path in fresh.items():
        assert (shipped / path.name).read_text() == path.read_text(), f"{name}: shipped data is stale"
        assert name in ev.resolve_tasks(ev.load_suite("tiny"))


def test_materialised_tasks_point_into_their_own_folder(tmp_path):
    """Two checkouts with the same task files get two copies: a copy's absolute data files point into the
    folder it was made from (a copy made from a checkout since deleted must never be reused)."""
    import shutil

    from klsweep import evaluate as ev

    a, b = tmp_path / "a" / "tiny", tmp_path / "b" / "tiny"
    for d in (a, b):
        shutil.copytree(ev.include_dir("builtin:tiny"), d)
    ma, mb = ev.materialise_tasks(a), ev.materialise_tasks(b)
    assert ma != mb
    assert str(a) in (ma / "tiny_add.yaml").read_text() and str(b) in (mb / "tiny_add.yaml").read_text()


PLANTED_EVAL = """
import sys
from dataclasses import replace
from pathlib import Path
from klsweep import evaluate as ev
(path,) = ev.eval_run(Path(sys.argv[1]), replace(ev.load_suite("tiny"), limit=8))
print(path)
"""


def test_an_eval_never_uses_a_task_folder_another_user_planted_in_tmp(tmp_path: Path) -> None:
    """Issue 47 item 1: the task copy was $TMPDIR/klsweep-evaltasks-<folder>-<digest>-<path hash>, a name anyone
    can compute, used as found. Another user (uid 65534; CI runs as root, so an owner check alone would not
    do) plants it with a utils.py that writes a marker (lm-eval imports it: ``!function utils.load_jsonl``) and
    with other answers in a jsonl. The eval (a real one, in a process of its own under that TMPDIR) neither
    runs the planted code nor reads the planted data: its scores and problems are those of a clean TMPDIR."""
    import hashlib
    import os
    import subprocess

    from klsweep.evaluate.suites import _digest
    from klsweep.tinymodel import tiny_model_path

    shipped = ev.include_dir("builtin:tiny")
    shared_tmp = tmp_path / "shared-tmp"
    where = hashlib.sha256(str(shipped.resolve()).encode()).hexdigest()[:8]
    planted = shared_tmp / f"klsweep-evaltasks-{shipped.name}-{_digest(shipped)}-{where}"
    shutil.copytree(shipped, planted)  # relative data files: utils.load_jsonl reads the planted jsonl
    marker = tmp_path / "marker"
    with open(planted / "utils.py", "a") as f:
        f.write(f"\nopen({str(marker)!r}, 'w').write('planted code ran')\n")
    rows = store.read_jsonl(planted / "tiny_add.jsonl")
    (planted / "tiny_add.jsonl").write_text(
        "".join(json.dumps({**r, "answer": str(int(r["answer"]) + 1)}) + "\n" for r in rows)
    )
    for p in [planted, *planted.rglob("*")]:
        os.chown(p, 65534, 65534)
    shared_tmp.chmod(0o1777)

    sweep = tmp_path / "sweep"
    run = make_run(sweep, "trained", tiny_model_path())
    reference = make_run(tmp_path / "clean", "trained", tiny_model_path())
    done = subprocess.run(
        [sys.executable, "-c", PLANTED_EVAL, str(run)],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "TMPDIR": str(shared_tmp)},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert not marker.exists(), "the planted utils.py ran inside the eval"
    got = Path(done.stdout.strip().splitlines()[-1])
    (want,) = ev.eval_run(reference, replace(ev.load_suite("tiny"), limit=8))
    assert json.loads(got.read_text())["metrics"] == json.loads(want.read_text())["metrics"]
    assert max(json.loads(want.read_text())["metrics"]["in_domain"].values()) > 0  # answers that count
    shipped_rows = store.read_jsonl(shipped / "tiny_add.jsonl")[:8]
    assert [r["doc"] for r in store.read_jsonl(got.parent / "samples_tiny_add.jsonl")] == shipped_rows
    assert sorted(p.name for p in shared_tmp.iterdir()) == [planted.name]  # its own copy removed at exit


UNREADABLE_EVAL = """
import sys
from dataclasses import replace
from pathlib import Path
from klsweep import evaluate as ev, store
run = Path(sys.argv[1])
print("stale:", store.stale_end(run))
try:
    ev.eval_run(run, replace(ev.load_suite("tiny"), limit=2))
except ev.EvalError as e:
    print("error:", e)
"""


def test_weights_a_colleague_cannot_read_are_a_permission_problem(tmp_path: Path, random_model: Path) -> None:
    """Issue 47 item 13: a done run whose weights another user cannot read (0600, as safetensors wrote them)
    read as a checkpoint "not whole" to train again from step 0, or a FileNotFoundError (safetensors' word for
    EACCES). The run stays done and its eval says the file cannot be read for its permissions, and what to do."""
    import os
    import subprocess

    from mounts import without_root_powers

    run = make_run(tmp_path / "sweep", "r1", random_model)
    store.write_status(run, "done", step=10, final_checkpoint="checkpoint-10")
    weights = run / store.CHECKPOINTS_DIR / "checkpoint-10" / "model.safetensors"
    os.chown(weights, 65534, 65534)
    weights.chmod(0o600)
    done = subprocess.run(
        [*without_root_powers(), sys.executable, "-c", UNREADABLE_EVAL, str(run)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "stale: None" in done.stdout, done.stdout
    assert (
        "checkpoint-10/model.safetensors cannot be read: permission denied (mode 0600, owner uid 65534"
        in (done.stdout)
    )
    assert "(chmod g+r, or a+r)" in done.stdout and "FileNotFoundError" not in done.stdout, done.stdout


def test_vllm_settings_are_lm_evals_model_args(random_model: Path) -> None:
    """eval.max_model_len and eval.gpu_memory_utilization become lm-eval's vllm model arguments (it hands them
    to vLLM's LLM: tests/integration/test_vllm_eval.py checks they arrive); null max_model_len leaves vLLM the
    model's own; the hash of an eval without them is what it was before the keys existed."""
    model = ModelSection(name="tiny", path=str(random_model))
    cfg = replace(ev.load_suite("tiny"), backend="vllm", max_model_len=512, gpu_memory_utilization=0.5)
    item = running.Item(str(random_model), model, Path("unused"), "checkpoint-1", 1, {})
    args = running.vllm_model_args(item, cfg)
    assert (args["max_model_len"], args["gpu_memory_utilization"]) == (512, 0.5)
    assert args["max_gen_toks"] == cfg.max_gen_toks
    assert args["pretrained"] == str(random_model)
    assert "max_model_len" not in running.vllm_model_args(item, replace(cfg, max_model_len=None))
    with pytest.raises(UserError, match="eval.tensor_parallel_size: 2, but no GPU is visible"):
        running.vllm_model_args(item, replace(cfg, tensor_parallel_size=2))

    plain = ev.load_suite("tiny")
    assert "max_model_len" not in ev.eval_settings(plain)  # the committed evals keep their folders
    assert ev.eval_settings(replace(plain, gpu_memory_utilization=0.5)) == ev.eval_settings(plain)
    assert ev.eval_settings(replace(plain, max_model_len=512))["max_model_len"] == 512
    for bad, where in (
        ({"max_model_len": plain.max_gen_toks}, f"eval.max_model_len: {plain.max_gen_toks} leaves no room"),
        ({"gpu_memory_utilization": 0.0}, "eval.gpu_memory_utilization: 0.0"),
    ):
        with pytest.raises(UserError, match=where):
            ev.as_eval_section(replace(plain, **bad))
