"""The dress rehearsal of a sweep (``klsweep rehearse``): the real path, small, before GPU-hours are spent.

``covering_runs`` picks a few runs of the plan that hold every model, estimator, placement, level, reward mode
and lag at least once (seeds and beta collapse; a run without KL counts as its own value). Each is rehearsed
with a random-weight model of its architecture class (``model_type``: the cached ``config.json``, else
``model.arch.model_type``) at a tiny size, with its own tokenizer when cached, else a byte-level stand-in,
and with the samples shipped in ``klsweep/rehearsal/`` in place of the hub datasets (the same schema). Stages:
``train`` (a few steps, a checkpoint half-way), ``resume`` (the last checkpoint removed, the run resumed from
the one before), ``eval`` (lm-eval with the grid's suite, its tasks pointed at the samples), ``report``. The
wires are checked on the way: the chat template, the eval tasks' prompt fields, the end token among the eval
stop sequences, train.max_prompt_length (the trainer's own refusal). Output: ``<out>/<name>/``, apart from the
sweep's results: marked (``MARKER``), so that run, status, eval and report refuse it, and locked while a
rehearsal writes it (``.<name>.rehearse.lock`` beside it). See docs/CLUSTER.md.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from klsweep import store
from klsweep.config import without_kl_when_off
from klsweep.errors import Problem, UserError, describe

SAMPLES = Path(__file__).parent / "rehearsal"
TRAIN_SAMPLES = {
    "DigitalLearningGmbH/MATH-lighteval": "math_train.jsonl",
    "EleutherAI/hendrycks_math": "math_train.jsonl",
}
EVAL_SAMPLES = {  # (dataset_path, dataset_name) of an lm-eval task -> its shipped sample
    ("HuggingFaceH4/MATH-500", "default"): "math500.jsonl",
    ("HuggingFaceH4/MATH-500", None): "math500.jsonl",
    **{("cais/mmlu", f"college_{s}"): f"mmlu_college_{s}.jsonl" for s in ("physics", "chemistry", "biology")},
}
COVERED = ("model.name", "kl.estimator", "kl.placement", "kl.level", "kl.reward_mode", "offpolicy.lag")
STAGES = ("train", "resume", "eval", "report")
DEFAULT_OUT = Path("results") / ".rehearsal"
MARKER = store.REHEARSAL_MARKER  # in a rehearsal's folder and run folders: a rerun replaces only a marked
# folder, and run, status, eval and report refuse one (store.refuse_rehearsal)
MARKER_TEXT = "a klsweep rehearsal: stand-in models trained a few steps, never a sweep's results\n"
# head_dim 64: vLLM's CPU attention refuses 16 (and every paper model's is 128: any a GPU kernel takes)
TINY = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=2,
            num_key_value_heads=1, head_dim=64, max_position_embeddings=4096)  # fmt: skip
# the sharding CPU-only processes run: one process, no sharding
ONE_PROCESS = "none"
# options of TRL's colocate vLLM its CPU build does not have (sleep mode frees GPU memory; one engine a process)
GPU_ONLY_VLLM = ("vllm_enable_sleep_mode", "vllm_tensor_parallel_size")


@dataclass
class RunRehearsal:
    """One rehearsed run: what it stands for, its stages' outcomes and notes."""

    run_id: str
    label: str  # the covered values
    run_dir: Path
    stages: dict[str, str] = field(default_factory=dict)  # stage -> "passed" | "failed" | "skipped"
    reasons: dict[str, str] = field(default_factory=dict)  # failed stage -> reason
    logs: dict[str, str] = field(default_factory=dict)  # failed stage -> its log file
    notes: list[str] = field(default_factory=list)  # what was swapped or not exercised
    # stage -> (engine, sharding, what it replaced or ""): what the stage ran with
    ran_with: dict[str, tuple[str, str, str]] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)  # the rehearsal's config of the run

    @property
    def passed(self) -> bool:
        return all(self.stages.get(s) == "passed" for s in STAGES)


@dataclass
class Rehearsal:
    name: str
    folder: Path
    runs: list[RunRehearsal]
    elapsed_s: float = 0.0
    # what `klsweep run` of the grid would refuse here, or its jobs lack here (``real_run_findings``)
    findings: list[str] = field(default_factory=list)
    cautions: list[str] = field(
        default_factory=list
    )  # what the jobs would fetch or do differently, not a refusal

    @property
    def passed(self) -> bool:
        """Every stage of every rehearsed run passed (the rehearsal itself; ``ready`` adds the findings)."""
        return bool(self.runs) and all(r.passed for r in self.runs)

    @property
    def ready(self) -> bool:
        """Passed, and nothing the real run needs is missing here: ``klsweep rehearse`` exits 0 only then."""
        return self.passed and not self.findings


def real_run_findings(plan: Any, fetch_command: str, gpus: int) -> tuple[list[str], list[str]]:
    """What the real run of ``plan`` needs that this machine lacks, as (findings, cautions). Findings:
    what ``klsweep run`` refuses here (an engine that does not import, ``engines.missing``; offline, a model or
    dataset the caches lack, ``fetch.require_cached``) and what its local jobs would lack (the GPUs the runs
    ask for). Cautions: models and datasets not cached here while online (each job downloads them)."""
    from klsweep import engines, fetch
    from klsweep.submit import default_cluster

    configs = [r.config for r in plan.runs]
    refuse = "the real run would refuse:"
    findings = [f"{refuse} {p.where} {p.what} ({p.allowed})" for p in engines.missing(configs)]
    cautions = []
    if fetch.offline(configs):
        try:
            fetch.require_cached(configs, fetch_command)
        except UserError as e:
            findings += [f"{refuse} offline, {p.where}: {p.what}" for p in e.problems[:-1]]
    else:
        absent = [f for f in fetch.check(n for n in fetch.needs(configs) if not n.local) if not f.cached]
        cautions += [
            f"{f.need.kind} {f.need.label} not cached here: each job downloads it ({fetch_command} first)"
            for f in absent
        ]
    cluster = default_cluster(plan)
    asked = max((int(c["model"]["resources"].get("gpus_per_node", 0)) for c in configs), default=0)
    if cluster in ("local", "debug") and asked > gpus:
        findings.append(
            f"the real run would lack: the runs ask for {asked} GPU(s) per node and this machine has {gpus} "
            f"(cluster {cluster}: they would train here without)"
        )
    return findings, cautions


def _values(config: dict[str, Any]) -> dict[str, Any]:
    """The covered keys' values of a resolved config, the KL-only ones ``no KL`` without KL."""
    from klsweep.grid.schema import lookup

    values = without_kl_when_off({key: lookup(config, key) for key in (*COVERED, "kl.beta")})
    return {key: values[key] for key in COVERED}  # beta collapses


def covering_runs(runs: list[Any]) -> list[Any]:
    """A small subset of ``runs`` (planned runs) holding every value of ``COVERED`` at least once: greedy set
    cover, in plan order on ties."""
    values = [{(k, json.dumps(v)) for k, v in _values(r.config).items()} for r in runs]
    left = set().union(*values) if values else set()
    chosen = []
    while left:
        best = max(range(len(runs)), key=lambda i: (len(values[i] & left), -i))
        chosen.append(runs[best])
        left -= values[best]
    return chosen


# ------------------------------------------------------------------------------------------------ the swaps


def tiny_model(model: dict[str, Any], folder: Path) -> tuple[Path, list[str]]:
    """A random-weight model of ``model``'s architecture class at a tiny size, saved in ``folder`` with its own
    tokenizer when the cache holds it, else the project's byte-level stand-in (ChatML template); notes saying
    which."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    from klsweep import fetch, tinymodel

    if model.get("path") == "tiny":
        return tinymodel.tiny_model_path(), ["the project's tiny model"]
    need = fetch.Need("model", model["path"], model.get("revision"))
    cached = fetch.check_model(need) if not need.local else fetch.Found(need, True, model["path"])
    model_type = (model.get("arch") or {}).get("model_type")
    real_config = Path(cached.where) / "config.json" if cached.where else None
    if real_config is not None and real_config.is_file():
        model_type = json.loads(real_config.read_text()).get("model_type", model_type)
    if not model_type:
        raise UserError(
            Problem(
                "model.arch.model_type", f"unknown for {model['path']} (not cached)", "qwen2, llama, qwen3"
            )
        )
    tokenizer, notes = None, []
    if cached.where:
        try:
            tokenizer = AutoTokenizer.from_pretrained(cached.where)
            notes.append(f"{model_type}, its own tokenizer")
        except (OSError, ValueError):
            tokenizer = None
    if tokenizer is None:
        tokenizer = tinymodel.build_tokenizer()
        notes.append(f"{model_type}, byte-level stand-in tokenizer (ChatML): its own is not cached")
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tie = bool((model.get("arch") or {}).get("tie_word_embeddings", True))
    config = AutoConfig.for_model(
        model_type, vocab_size=len(tokenizer), tie_word_embeddings=tie, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id, **TINY,
    )  # fmt: skip
    net = AutoModelForCausalLM.from_config(config)
    net.generation_config = GenerationConfig(
        eos_token_id=[tokenizer.eos_token_id], pad_token_id=tokenizer.pad_token_id
    )
    folder.mkdir(parents=True, exist_ok=True)
    net.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder, notes


def _rewire_tasks(include: Path | None, names: list[str], target: Path) -> Path:
    """A copy of the suite's task folder whose tasks read the shipped samples (``EVAL_SAMPLES``) instead of
    the hub; ``UserError`` for a task whose dataset has no sample."""
    from klsweep.fetch import task_yaml

    if include is None:
        raise UserError(
            Problem("eval.include_path", "lm-eval's own tasks have no shipped sample", "a task folder")
        )
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(include, target, ignore=shutil.ignore_patterns("__pycache__"))
    problems = []
    found = set()
    for path in sorted(target.rglob("*.yaml")):
        cfg = task_yaml(path)
        if cfg.get("task") not in names:
            continue
        found.add(cfg["task"])
        key = (cfg.get("dataset_path"), cfg.get("dataset_name"))
        if key[0] in ("json", "csv", "parquet"):
            continue
        sample = EVAL_SAMPLES.get(key)
        if sample is None:
            problems.append(
                Problem(f"eval task {cfg['task']}", f"no shipped sample of {key[0]} {key[1] or ''}")
            )
            continue
        split = cfg.get("test_split") or "test"
        lines = [
            ln
            for ln in path.read_text().splitlines()
            if not ln.startswith(("dataset_path:", "dataset_name:"))
        ]
        lines += ["dataset_path: json", "dataset_name: null",
                  f"dataset_kwargs: {{data_files: {{{split}: {json.dumps(str(SAMPLES / sample))}}}}}"]  # fmt: skip
        path.write_text("\n".join(lines) + "\n")
    if problems:
        raise UserError(problems, title="no rehearsal data")
    return target


def _check_prompt_fields(folder: Path, names: list[str]) -> None:
    """Each task's ``doc_to_text`` renders on its first sample row (the fields it names are in the data)."""
    import jinja2

    from klsweep.fetch import task_yaml

    for path in sorted(folder.rglob("*.yaml")):
        cfg = task_yaml(path)
        if cfg.get("task") not in names or not isinstance(cfg.get("doc_to_text"), str):
            continue
        files = (cfg.get("dataset_kwargs") or {}).get("data_files") or {}
        data = next(iter(files.values()), None) if isinstance(files, dict) else None
        if not data or not Path(data).is_file():
            continue
        row = json.loads(Path(data).read_text().splitlines()[0])
        try:
            jinja2.Environment(undefined=jinja2.StrictUndefined).from_string(cfg["doc_to_text"]).render(**row)
        except jinja2.TemplateError as e:
            raise UserError(
                Problem(
                    f"eval task {cfg['task']} ({path.name}): doc_to_text", str(e), f"fields {sorted(row)}"
                )
            ) from e


def _check_chat(model_dir: Path, config: dict[str, Any], folder: Path, names: list[str]) -> None:
    """The tokenizer has the chat template ``model.chat_template`` asks for, and the eval tasks stop at its end
    token."""
    from transformers import AutoTokenizer

    from klsweep.fetch import task_yaml

    tok = AutoTokenizer.from_pretrained(model_dir)
    problems = []
    if config["model"].get("chat_template") and not tok.chat_template:
        problems.append(
            Problem(
                "model.chat_template",
                f"true, but the tokenizer of {config['model']['path']} has no chat template",
                "false for a base model",
            )
        )
    for path in sorted(folder.rglob("*.yaml")):
        cfg = task_yaml(path)
        if cfg.get("task") not in names:
            continue
        until = (cfg.get("generation_kwargs") or {}).get("until") or []
        if tok.eos_token and until and tok.eos_token not in until:
            problems.append(
                Problem(
                    f"eval task {cfg['task']}: generation_kwargs.until",
                    f"lacks the tokenizer's end token {tok.eos_token!r}: answers run on to max_gen_toks",
                    f"add {tok.eos_token!r}",
                )
            )
    if problems:
        raise UserError(problems, title="chat template mismatch")


# ------------------------------------------------------------------------------------------------ the run


def rehearsal_config(
    config: dict[str, Any], model_dir: Path, tasks_dir: Path | None, gpus: int
) -> tuple[dict[str, Any], list[str], dict[str, tuple[str, str, str]]]:
    """The run's config, small: the tiny model, the samples, a few steps (the lag exercised), one process;
    generation and eval through vLLM where the grid asks for it and it is installed here (its CPU build
    without a GPU), else HF. Also the notes and what each stage runs with (``RunRehearsal.ran_with``)."""
    from klsweep import engines

    notes = []
    lag = int(config.get("offpolicy", {}).get("lag", 0))
    steps = max(2, lag + 2)
    vllm = engines.vllm_build()
    wants_vllm = bool(config["train"].get("use_vllm"))
    train = {**config["train"], "steps": steps, "save_steps": max(1, steps // 2), "keep_checkpoints": None,
             "prompts_per_step": 2, "micro_batch_size": None, "max_completion_length": 16,
             "use_vllm": wants_vllm and vllm is not None}  # fmt: skip
    gen = "HF generate"
    if train["use_vllm"]:
        gen = f"{vllm} colocate"
        if not gpus:
            trl = dict(train.get("trl") or {})
            for option in GPU_ONLY_VLLM:
                if option in trl:
                    notes.append(f"{option} not exercised: not in vLLM's CPU build")
                    del trl[option]
            train["trl"] = trl
    elif wants_vllm:
        notes.append("HF generate in place of vLLM: vllm does not import here")
    sharding = train.get("sharding", "none")
    if sharding != ONE_PROCESS:
        notes.append(f"sharding {sharding} not exercised: one process" + ("" if gpus else ", no GPU here"))
        train["sharding"] = ONE_PROCESS
    shard_note = ONE_PROCESS if sharding == ONE_PROCESS else f"{ONE_PROCESS} (for {sharding})"
    # every part the stage swapped for a stand-in, named (the stage table's "in place of")
    asked = int(config["model"]["resources"].get("gpus_per_node", 0))
    real_model = config["model"]["path"] != "tiny"  # the project's tiny model is rehearsed as itself
    common = [f"a tiny random model for {config['model']['path']}"] if real_model else []
    if asked > min(gpus, 1):
        common.append(f"{'1 GPU' if gpus else 'the CPU'} for {asked} GPU(s)")
    task = dict(config["task"])
    swapped = list(common)
    if task.get("name") == "math":
        dataset = task.get("dataset") or "DigitalLearningGmbH/MATH-lighteval"
        if dataset in TRAIN_SAMPLES:
            task["dataset"] = str(SAMPLES / TRAIN_SAMPLES[dataset])
            swapped.append(f"shipped samples for {dataset}")
    swapped.append(f"{steps} steps for {config['train'].get('steps')}")
    if wants_vllm and not train["use_vllm"]:
        swapped.append("HF generate for vLLM (not installed)")
    ran_with = {stage: (gen, shard_note, "; ".join(swapped)) for stage in ("train", "resume")}
    resources = {
        **config["model"]["resources"],
        "gpus_per_node": min(gpus, 1),
        "tasks_per_node": 1,
        "nodes": 1,
    }
    model = {**config["model"], "path": str(model_dir), "revision": None, "resources": resources}
    if not gpus:
        model["dtype"] = "auto"
    ev = dict(config.get("eval", {}))
    if tasks_dir is not None:
        wants = ev.get("backend", "hf")
        backend = "vllm" if wants == "vllm" and vllm is not None else "hf"
        if wants == "vllm" and backend == "hf":
            notes.append("lm-eval hf in place of vllm: vllm does not import here")
        longest = TINY["max_position_embeddings"]
        if (ev.get("max_model_len") or longest) > longest:
            notes.append(f"eval.max_model_len {ev['max_model_len']} cut to the stand-in's {longest}")
            ev["max_model_len"] = longest
        limit = ev.get("limit")
        ev.update(include_path=str(tasks_dir), limit=4, max_gen_toks=16, num_samples=1, backend=backend,
                  batch_size=8, tensor_parallel_size=1)  # fmt: skip
        engine = f"lm-eval vllm, {vllm}" if backend == "vllm" else "lm-eval hf"
        copies = engines.eval_copies(config)
        one = "one copy" if copies == 1 else f"one copy (for {copies})"
        swapped = [*common, f"4 shipped sample problems per task for {limit or 'all'}"]
        if wants != backend:
            swapped.append("lm-eval hf for vLLM (not installed)")
        ran_with["eval"] = (engine, one, "; ".join(swapped))
    out = {**config, "model": model, "train": train, "task": task, "eval": ev,
           "wandb": {**config.get("wandb", {}), "mode": "disabled"}}  # fmt: skip
    return out, notes, ran_with


def _stage(run: RunRehearsal, stage: str, fn: Callable[[], None]) -> bool:
    if any(v == "failed" for v in run.stages.values()):
        run.stages[stage] = "skipped"
        return False
    log = run.run_dir / "logs" / f"rehearse-{stage}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "a") as f, contextlib.redirect_stdout(f), contextlib.redirect_stderr(f):
        try:
            fn()
        except Exception as e:
            traceback.print_exc(file=f)
            run.stages[stage] = "failed"
            run.reasons[stage] = " / ".join(map(str, e.problems)) if isinstance(e, UserError) else describe(e)
            run.logs[stage] = str(log)
            return False
    run.stages[stage] = "passed"
    return True


def _train(run_dir: Path) -> None:
    from klsweep.job import train_run

    status = train_run(run_dir)
    if status["state"] != "done":
        raise RuntimeError(status.get("reason") or status["state"])


def _resume(run_dir: Path, steps: int) -> None:
    """Remove the last checkpoint (as a job killed before it was saved), resume from the one before."""
    from klsweep.job import train_run

    found = store.checkpoints(run_dir)
    if len(found) < 2:
        raise RuntimeError(f"{len(found)} checkpoint(s) after training: nothing to resume from")
    shutil.rmtree(found[-1])
    store.write_status(run_dir, "running", finished_at=None, final_checkpoint=None)
    status = train_run(run_dir)
    if status["state"] != "done":
        raise RuntimeError(status.get("reason") or status["state"])
    rows = [r["step"] for r in store.read_metrics(run_dir)]
    if rows != list(range(1, steps + 1)):
        raise RuntimeError(f"metrics steps after the resume: {rows}, expected 1..{steps}")


def _eval(run_dir: Path, eval_cfg: dict[str, Any]) -> None:
    from klsweep.evaluate import eval_run, include_dir

    _check_prompt_fields(include_dir(eval_cfg["include_path"]), [*eval_cfg["in_domain"], *eval_cfg["ood"]])
    eval_run(run_dir, eval_cfg)


def rehearse(
    grid_path: str | Path,
    overrides: list[str] | None = None,
    out: str | Path | None = None,
    on_run: Callable[[RunRehearsal], None] | None = None,
    config_dirs: list[str] | None = None,
) -> Rehearsal:
    """Rehearse the covering runs of a grid in this process (see the module docstring), then say what the real
    run needs that is missing here (``Rehearsal.findings``, ``real_run_findings``). ``UserError`` when
    another rehearsal writes the same folder, or the folder holds anything but a rehearsal
    (``_only_rehearsal``)."""
    from klsweep import grid, planner

    start = time.time()
    plan = grid.load_plan(grid_path, overrides, out=Path(out or DEFAULT_OUT), config_dirs=config_dirs)
    planner.check(plan)
    folder = Path(plan.sweep_dir)
    lock = _only_rehearsal(folder)
    try:
        done = _rehearse(plan, folder, on_run, start)
    finally:
        os.close(lock)  # releases it; the file stays (removing it would let a third one lock another file)
    import torch

    from klsweep.fetch import fetch_command

    real = grid.load_plan(grid_path, overrides)  # the real run's plan (its results folder, its commits)
    done.findings, done.cautions = real_run_findings(
        real, fetch_command(grid_path, overrides), torch.cuda.device_count()
    )
    return done


def _only_rehearsal(folder: Path) -> int:
    """Before a rehearsal into ``folder``: a lock (``flock``) on ``.<name>.rehearse.lock`` beside it, held
    until the returned fd is closed, so that a second rehearsal into the same folder is refused instead of
    removing the first one's files; then the folder emptied, when it holds a previous rehearsal.
    ``UserError`` (nothing touched) when another rehearsal holds the lock, or the folder holds something
    else: a sweep's results (``klsweep run`` leaves its jobs.jsonl even in a marked folder), whatever a user
    put there."""
    import fcntl

    problem = store.not_a_folder(folder)
    if problem is not None:
        raise UserError(Problem("--out", problem, "a folder"))
    folder.parent.mkdir(parents=True, exist_ok=True)
    lock = os.open(
        folder.parent / f".{folder.name}.rehearse.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666
    )
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(lock)
        raise UserError(
            Problem(
                "--out",
                f"another `klsweep rehearse` is writing {folder} now",
                "wait for it, or another --out",
            ),
            title="rehearsal under way",
        ) from None
    except OSError:  # no flock on this file system: unlocked, as before
        pass
    if folder.exists() and any(folder.iterdir()):
        sweep = (folder / store.JOBS_FILE).exists() or (folder / "submitit").exists()
        if sweep or not (folder / MARKER).is_file():
            os.close(lock)
            what = (
                "a sweep's results (its jobs.jsonl)"
                if sweep
                else "something else than a rehearsal (a sweep?)"
            )
            raise UserError(Problem("--out", f"{folder} holds {what}", "another --out"))
        shutil.rmtree(folder)  # the previous rehearsal
    folder.mkdir(parents=True, exist_ok=True)
    (folder / MARKER).write_text(MARKER_TEXT)
    return lock


def _rehearse(
    plan: Any, folder: Path, on_run: Callable[[RunRehearsal], None] | None, start: float
) -> Rehearsal:
    import torch

    from klsweep.evaluate import include_dir
    from klsweep.report import build_report
    from klsweep.submit.sweep import write_sweep_file

    gpus = torch.cuda.device_count()
    chosen = covering_runs(plan.runs)
    models: dict[str, tuple[Path, list[str]]] = {}
    tasks_dirs: dict[str, Path | None] = {}
    rehearsed = []
    for run in chosen:
        values = _values(run.config)
        label = " ".join(str(v) for v in values.values())
        rr = RunRehearsal(run.id, label, folder / run.id)
        rehearsed.append(rr)
        ev = run.config.get("eval", {})
        names = [*ev.get("in_domain", []), *ev.get("ood", [])]

        def prepare(run: Any = run, rr: RunRehearsal = rr, ev: dict = ev, names: list = names) -> None:
            key = json.dumps(run.config["model"], sort_keys=True)
            if key not in models:
                models[key] = tiny_model(run.config["model"], folder / ".models" / f"m{len(models)}")
            model_dir, notes = models[key]
            rr.notes += notes
            tasks_dir = None
            if names:
                tk = json.dumps(ev.get("include_path"))
                if tk not in tasks_dirs:
                    target = folder / ".evaltasks" / f"t{len(tasks_dirs)}"
                    tasks_dirs[tk] = _rewire_tasks(include_dir(ev.get("include_path")), names, target)
                tasks_dir = tasks_dirs[tk]
                _check_chat(model_dir, run.config, tasks_dir, names)
            config, notes, rr.ran_with = rehearsal_config(run.config, model_dir, tasks_dir, gpus)
            rr.notes += notes
            rr.run_dir.mkdir(parents=True, exist_ok=True)
            (rr.run_dir / MARKER).write_text(MARKER_TEXT)
            from klsweep.config import write_run

            write_run(rr.run_dir, config)
            rr.config = config

        if _stage(rr, "train", lambda prepare=prepare, rr=rr: (prepare(), _train(rr.run_dir))):
            steps = rr.config["train"]["steps"]
            _stage(rr, "resume", lambda rr=rr, steps=steps: _resume(rr.run_dir, steps))
        else:
            rr.stages["resume"] = "skipped"
        if names:
            _stage(rr, "eval", lambda rr=rr: _eval(rr.run_dir, rr.config["eval"]))
        else:
            rr.stages["eval"] = "passed"
            rr.notes.append("no eval suite")
    sweep_plan = type(plan)(plan.name, folder, [r for r in chosen], plan.axes, 0, plan.grid_text)
    write_sweep_file(sweep_plan, "local")
    report = RunRehearsal("", "", folder)
    _stage(report, "report", lambda: build_report(folder, formats=["md"], wandb=False, rehearsal=True))
    for rr in rehearsed:
        if any(v == "failed" for v in rr.stages.values()):
            rr.stages["report"] = "skipped"
        else:
            rr.stages["report"] = report.stages["report"]
            rr.reasons.update(report.reasons)
            rr.logs.update(report.logs)
        if on_run is not None:
            on_run(rr)
    return Rehearsal(plan.name, folder, rehearsed, time.time() - start)


def rehearse_on_slurm(
    grid_path: str | Path,
    overrides: list[str] | None = None,
    out: str | Path | None = None,
    config_dirs: list[str] | None = None,
) -> tuple[Rehearsal, str]:
    """``rehearse`` as one short Slurm job on the grid's partition (its cluster settings: partition, account,
    qos, setup), with one GPU when the grid's models ask for GPUs; waits for it. Returns the rehearsal and the
    job's log."""
    import submitit

    from klsweep import grid, planner
    from klsweep.submit.slurm import slurm_parameters

    out = Path(out or DEFAULT_OUT).absolute()
    plan = grid.load_plan(grid_path, overrides, out=out, config_dirs=config_dirs)
    planner.check(plan)  # what the job's rehearse would refuse, refused before a job is submitted
    first = plan.runs[0].config
    gpus = max(int(r.config["model"]["resources"].get("gpus_per_node", 0)) for r in plan.runs)
    res = {**first["model"]["resources"], "nodes": 1, "tasks_per_node": 1, "gpus_per_node": min(gpus, 1),
           "timeout_min": 30, "mem_gb": min(int(first["model"]["resources"].get("mem_gb", 16)), 64)}  # fmt: skip
    params = slurm_parameters(res, first.get("cluster", {}), f"{plan.name}-rehearsal", eval_job=False)
    params.pop("array_parallelism", None)
    ex = submitit.SlurmExecutor(folder=out / f".submitit-{plan.name}", max_num_timeout=0)
    ex.update_parameters(**params)
    try:
        dirs = [str(Path(d).absolute()) for d in config_dirs or []]
        job = ex.submit(rehearse, grid.grid_file(grid_path).absolute(), overrides, out, None, dirs)
    except submitit.core.utils.FailedJobError as e:
        where = ", ".join(f"{k}={v}" for k, v in params.items() if k in ("partition", "gpus_per_node", "mem"))
        raise UserError(
            Problem(f"--cluster slurm ({where})", f"sbatch refused the rehearsal job: {describe(e)}",
                    "cluster.partition/account/qos of a partition with what the grid's models ask for"),
        ) from e  # fmt: skip
    return job.result(), str(job.paths.stdout)
