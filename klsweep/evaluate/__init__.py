"""Evaluation of runs' checkpoints with lm-eval: an in-domain and an out-of-domain suite, pass@1.

- ``suites.py``: a suite (``klsweep/conf/eval/<suite>.yaml``), its lm-eval tasks and the eval hash;
- ``running.py``: lm-eval on one model, its ``results.json`` and ``samples_<task>.jsonl``;
- ``runs.py``: which checkpoints of a run, the step-0 baseline, a run's eval error recorded in the run.

The suites, the result layout and the results contract: docs/DESIGN.md (evaluation). Deciding what
``klsweep eval`` evaluates and submitting its jobs is ``klsweep.submit.evals``'s.
"""

from klsweep.evaluate.running import RESULTS_FILE
from klsweep.evaluate.runs import (
    BASELINE_CHECKPOINT,
    CHECKPOINT_CHOICES,
    ERROR_FILE,
    EvalOutcome,
    baseline_results,
    eval_baseline,
    eval_batch,
    eval_many,
    eval_run,
    model_key,
    results_paths,
    run_config,
    scored,
)
from klsweep.evaluate.suites import (
    BACKENDS,
    TASKS_DIR,
    EvalError,
    Suite,
    as_eval_section,
    eval_hash,
    eval_label,
    eval_settings,
    include_dir,
    lm_eval_version,
    load_suite,
    materialise_tasks,
    resolve_tasks,
    with_overrides,
)

__all__ = [
    "BACKENDS",
    "BASELINE_CHECKPOINT",
    "CHECKPOINT_CHOICES",
    "ERROR_FILE",
    "RESULTS_FILE",
    "TASKS_DIR",
    "EvalError",
    "EvalOutcome",
    "Suite",
    "as_eval_section",
    "baseline_results",
    "eval_baseline",
    "eval_batch",
    "eval_hash",
    "eval_label",
    "eval_many",
    "eval_run",
    "eval_settings",
    "include_dir",
    "lm_eval_version",
    "load_suite",
    "materialise_tasks",
    "model_key",
    "resolve_tasks",
    "with_overrides",
    "run_config",
    "results_paths",
    "scored",
]
