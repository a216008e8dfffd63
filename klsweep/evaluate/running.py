"""Running lm-eval on one model: ``evaluate_item`` writes its ``results.json`` and ``samples_<task>.jsonl``.

Also lm-eval's own results file (``results_<date>.json``, via its ``EvaluationTracker``) for lm-eval's
tooling. The results contract is in docs/DESIGN.md.
"""

from __future__ import annotations

import contextlib
import gc
import json
import math
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from klsweep import engines, environment, store
from klsweep.config import EvalSection, ModelSection
from klsweep.errors import Problem, UserError
from klsweep.evaluate.suites import EvalError, Suite, lm_eval_version

RESULTS_FILE = "results.json"


@dataclass
class Item:
    """One model to evaluate and where its results go."""

    model_path: str
    model: ModelSection
    out_dir: Path  # .../eval/<hash>/<checkpoint-name>
    checkpoint: str
    step: int
    settings: dict[str, Any]


def vllm_model_args(item: Item, cfg: EvalSection) -> dict[str, Any]:
    """lm-eval's ``vllm`` model arguments for one item (its ``VLLM`` passes the ones it does not know to vLLM's
    ``LLM``: ``gpu_memory_utilization``, ``enforce_eager``)."""
    import torch

    gpus = max(1, item.model.resources.gpus_per_node)
    tp = cfg.tensor_parallel_size
    args = {
        "pretrained": item.model_path,
        "dtype": item.model.dtype,
        "tensor_parallel_size": tp,
        "data_parallel_size": max(1, gpus // tp),
        "max_gen_toks": cfg.max_gen_toks,
        "gpu_memory_utilization": cfg.gpu_memory_utilization,
        **_pin(item),
    }
    if cfg.max_model_len is not None:
        args["max_model_len"] = cfg.max_model_len
    if not torch.cuda.is_available():  # vLLM's CPU build (a test and rehearsal path): one engine, no graphs
        if tp > 1:
            raise UserError(
                Problem(
                    "eval.tensor_parallel_size",
                    f"{tp}, but no GPU is visible: vLLM's CPU build runs one engine (no tensor parallel)",
                    "1 without a GPU",
                )
            )
        dtype = "float32" if item.model.dtype == "auto" else item.model.dtype
        args.update(dtype=dtype, data_parallel_size=1, enforce_eager=True)
    return args


def _kv_cache_need(item: Item, cfg: EvalSection) -> int:
    """The KV cache of the eval's vLLM engine on a CPU: ``eval.batch_size`` sequences of its context
    (``eval.max_model_len``, else the model's ``max_position_embeddings`` as vLLM takes it; 2,048 where the
    config has none, vLLM's too)."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(item.model_path, **_pin(item))
    text = config.get_text_config()
    longest = cfg.max_model_len or getattr(text, "max_position_embeddings", None) or 2048
    return engines.kv_cache_bytes(config, longest, cfg.batch_size)


def _pin(item: Item) -> dict[str, str]:
    """A hub model's baseline at the commit its runs trained from (a checkpoint is a local folder)."""
    return {"revision": item.model.revision} if item.model.revision and item.step == 0 else {}


def _make_lm(item: Item, cfg: EvalSection) -> Any:
    import torch
    from lm_eval.api.registry import get_model

    if cfg.backend == "vllm":
        engines.import_lm_eval_vllm()
        args = vllm_model_args(item, cfg)
        with contextlib.ExitStack() as stack:
            if not torch.cuda.is_available():
                stack.enter_context(engines.cpu_kv_cache(_kv_cache_need(item, cfg)))
            return get_model("vllm").create_from_arg_obj(args, {"batch_size": "auto"})

    dtype = item.model.dtype
    pin = _pin(item)

    device = "cuda" if torch.cuda.is_available() else "cpu"
    if dtype == "auto":
        dtype = "bfloat16" if device == "cuda" else "float32"
    args = {"pretrained": item.model_path, "dtype": dtype, **pin}
    return get_model("hf").create_from_arg_obj(args, {"batch_size": cfg.batch_size, "device": device})


def _primary_key(result: dict[str, Any], task_config: dict[str, Any], metric: str) -> str:
    """``"<metric>,<filter>"``: the task's first filter (lm-eval names an unfiltered result ``none``)."""
    filters = [f["name"] for f in task_config.get("filter_list") or []] or ["none"]
    for name in filters:
        if f"{metric},{name}" in result:
            return f"{metric},{name}"
    raise EvalError(f"the task's results have no {metric!r}: {sorted(k for k in result if ',' in k)}")


def _json_line(row: dict[str, Any]) -> str:
    return json.dumps(row, default=lambda o: o.item() if hasattr(o, "item") else str(o))


@contextlib.contextmanager
def quiet_git_hash() -> Iterator[None]:
    """lm-eval records the git commit of the folder it runs in (``get_git_commit_hash``: ``git describe`` with
    git's stderr left on the terminal), so every evaluation outside a git checkout printed git's "fatal: not a
    git repository". Its own function still runs, with git's stderr (this process's file descriptor 2, which
    git inherits) sent to /dev/null for the while."""
    import lm_eval.evaluator

    original = lm_eval.evaluator.get_git_commit_hash

    def quiet() -> Any:
        sys.stderr.flush()
        saved, devnull = os.dup(2), os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, 2)
            return original()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            os.close(devnull)

    lm_eval.evaluator.get_git_commit_hash = quiet
    try:
        yield
    finally:
        lm_eval.evaluator.get_git_commit_hash = original


def evaluate_item(item: Item, suite: Suite) -> Path:
    """Run lm-eval on one model, write results.json and samples_<task>.jsonl; returns results.json. The heap
    alive before it (a warm eval job's imports) is left out of the collection that frees the model after it
    (``environment.frozen_heap``)."""
    with environment.frozen_heap():
        return _evaluate_item(item, suite)


def _evaluate_item(item: Item, suite: Suite) -> Path:
    import lm_eval

    cfg = suite.cfg
    suite.load()
    started = time.time()
    lm = _make_lm(item, cfg)
    per_sample: dict[str, list[float]] = {}
    stderr_one: dict[str, float | None] = {}
    keys: dict[str, str] = {}
    samples: dict[str, list[dict[str, Any]]] = {}
    chat = item.model.chat_template if cfg.apply_chat_template is None else cfg.apply_chat_template
    gen = {"max_gen_toks": cfg.max_gen_toks, "temperature": cfg.temperature, "do_sample": cfg.temperature > 0}
    lm_eval_files: list[str] = []
    try:
        for seed in range(cfg.num_samples):
            tracker = _lm_eval_tracker(item)
            with quiet_git_hash():
                res = lm_eval.simple_evaluate(
                    model=lm,
                    model_args=f"pretrained={item.model_path}",  # what lm-eval's results file names the model by
                    tasks=list(suite.tasks.values()),
                    num_fewshot=cfg.num_fewshot,
                    limit=cfg.limit,
                    log_samples=True,
                    apply_chat_template=chat,
                    gen_kwargs=gen,
                    random_seed=seed,
                    numpy_random_seed=seed,
                    torch_random_seed=seed,
                    fewshot_random_seed=seed,
                    task_manager=suite.manager,
                    evaluation_tracker=tracker,
                )
            lm_eval_files.append(_save_lm_eval_results(tracker, res, cfg.backend))
            for task in suite.tasks:
                result = res["results"][task]
                keys[task] = key = _primary_key(result, res["configs"][task], cfg.metric)
                per_sample.setdefault(task, []).append(float(result[key]))
                err = result.get(key.replace(",", "_stderr,", 1))
                stderr_one[task] = float(err) if isinstance(err, int | float) else None  # lm-eval: "N/A"
                for row in res["samples"][task]:
                    samples.setdefault(task, []).append(
                        {"sample_index": seed, **row} if cfg.num_samples > 1 else row
                    )
    finally:
        del lm
        gc.collect()
    values = {task: sum(v) / len(v) for task, v in per_sample.items()}
    stderr = stderr_one if cfg.num_samples == 1 else _pass1_stderr(samples, keys, cfg.metric)
    for task, rows in samples.items():
        store.atomic_write_text(
            item.out_dir / f"samples_{task}.jsonl", "".join(_json_line(r) + "\n" for r in rows)
        )
    results = {
        "suite": cfg.suite,
        "eval_hash": item.out_dir.parent.name,
        "checkpoint": item.checkpoint,
        "step": item.step,
        "backend": cfg.backend,
        "metric": cfg.metric,
        "metrics": {
            "in_domain": {t: values[t] for t in cfg.in_domain},
            "ood": {t: values[t] for t in cfg.ood},
        },
        "stderr": stderr,
        "settings": item.settings,
        "lm_eval_version": lm_eval_version(),
        "created_at": time.time(),
        # Beyond the DESIGN.md contract: what each number is and what was evaluated.
        "final_state": _final_state(Path(item.model_path)),
        "metric_keys": keys,
        "chat_template_applied": chat,
        "num_problems": {
            t: len([r for r in samples[t] if _is_primary(r, keys[t])]) // cfg.num_samples for t in samples
        },
        "model_path": item.model_path,
        "elapsed_s": round(time.time() - started, 3),
        "cpu_threads": _cpu_threads(cfg),
        "lm_eval_results": lm_eval_files,
    }
    path = item.out_dir / RESULTS_FILE
    store.write_json(path, results)
    return path


def _cpu_threads(cfg: EvalSection) -> int | None:
    """torch's intra-op threads of an hf eval on CPU (a local job's share of the cores), else None."""
    import torch

    return torch.get_num_threads() if cfg.backend == "hf" and not torch.cuda.is_available() else None


def _final_state(checkpoint: Path) -> str | None:
    """``done`` or ``diverged`` when ``checkpoint`` is where its run ended (``store.FINAL_MARKER``), else None
    (an earlier checkpoint, or a model that is not a run's checkpoint)."""
    marker = checkpoint / store.FINAL_MARKER
    return store.read_json(marker).get("state") if marker.is_file() else None


def _lm_eval_tracker(item: Item) -> Any:
    """lm-eval's own ``EvaluationTracker``, writing to ``<out_dir>/results_<date>.json`` (as ``lm_eval
    --output_path <out_dir>/results.json`` does)."""
    from lm_eval.loggers import EvaluationTracker

    return EvaluationTracker(output_path=str(item.out_dir / RESULTS_FILE))


def _save_lm_eval_results(tracker: Any, res: dict[str, Any], backend: str) -> str:
    """lm-eval's results file of one ``simple_evaluate`` (its schema: ``results``, ``configs``, ``versions``,
    ``n-shot``, ``config``, ..., as lm-eval's CLI writes it; without the samples, which are klsweep's
    ``samples_<task>.jsonl``), so that lm-eval's tooling (``lm_eval.utils.make_table``, its result loaders)
    reads it. Returns the file's name."""
    tracker.general_config_tracker.model_source = backend  # lm-eval records "CUSTOM" for a model object
    tracker.save_results_aggregated(
        results={k: v for k, v in res.items() if k != "samples"}, samples=res.get("samples")
    )
    name = f"results_{tracker.date_id}.json"
    if not (Path(tracker.output_path).parent / name).is_file():  # lm-eval logs a failure and goes on
        raise EvalError(
            f"lm-eval did not write its results file {name} in {Path(tracker.output_path).parent}"
        )
    return name


def _is_primary(row: dict[str, Any], key: str) -> bool:
    return row.get("filter", "none") == key.split(",", 1)[1]


def _pass1_stderr(
    samples: dict[str, list[dict[str, Any]]], keys: dict[str, str], metric: str
) -> dict[str, float | None]:
    """Standard error over problems of the per-problem mean score across samples (pass@1 with n samples)."""
    out = {}
    for task, rows in samples.items():
        by_doc: dict[Any, list[float]] = {}
        for r in rows:
            if _is_primary(r, keys[task]):
                by_doc.setdefault(r["doc_id"], []).append(float(r[metric]))
        means = [sum(v) / len(v) for v in by_doc.values()]
        n = len(means)
        mu = sum(means) / max(n, 1)
        out[task] = math.sqrt(sum((m - mu) ** 2 for m in means) / (n - 1) / n) if n > 1 else None
    return out
