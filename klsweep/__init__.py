"""klsweep: sweeps of KL-regularised GRPO runs on Slurm.

The path of a run, and where each step lives (each package/module imports only those after it on this path's
lower layers; ``lint-imports`` checks it):

    grid/      grid YAML -> validated Plan of runs             load_plan, Plan
    planner    launch checks and resource estimates of a Plan  (klsweep plan)
    submit/    submitit jobs: local, Slurm arrays, state       submit, status, cancel, submit_eval
    job        one run in its folder: train, metrics, resume   train_run
    trainer    KLGRPOTrainer: TRL's GRPOTrainer + any KL       KLGRPOTrainer
    grpo       GRPO's advantages, reward modes, aggregation    (klsweep.grpo)
    kl         the KL estimators and surrogates (the math)     KLConfig, estimate, surrogate
    audit      exact enumeration: estimators, GRPO objective   grpo_audit (klsweep audit [--grpo])
    evaluate   lm-eval on a run's checkpoints                  eval_run
    report/    tables, statistics, figures, renderers          build_report

The public names below are importable from ``klsweep`` itself; they are loaded on first use, so ``import
klsweep`` stays light (no torch, TRL, lm-eval or pandas until a name that needs them is touched).
``klsweep.submit`` is the submission package (its entry point is ``klsweep.submit.submit``).
"""

from __future__ import annotations

import importlib
import os
from typing import Any

__version__ = "0.1.0"

# The same CPU kernels on every x86-64 machine with AVX2 (torch's ATen and MKL would otherwise pick AVX-512
# where the CPU has it, and a CPU run's numbers would depend on the machine): set before klsweep imports torch,
# inherited by every job it starts. A value the user exported wins; KLSWEEP_CPU_KERNELS=native keeps the
# machine's own. docs/DESIGN.md, "Reproducible across CPUs".
PORTABLE_CPU_KERNELS = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}
if os.environ.get("KLSWEEP_CPU_KERNELS", "portable") != "native":
    for _name, _value in PORTABLE_CPU_KERNELS.items():
        os.environ.setdefault(_name, _value)

_EXPORTS = {
    "KLConfig": "klsweep.kl",
    "estimate": "klsweep.kl",
    "surrogate": "klsweep.kl",
    "token_terms": "klsweep.kl",
    "forward_estimate": "klsweep.kl",
    "grpo_audit": "klsweep.audit",
    "KLGRPOTrainer": "klsweep.trainer",
    "load_plan": "klsweep.grid",
    "Plan": "klsweep.grid",
    "PlannedRun": "klsweep.grid",
    "status": "klsweep.submit",
    "cancel": "klsweep.submit",
    "wait_until_final": "klsweep.submit",
    "submit_eval": "klsweep.submit",
    "train_run": "klsweep.job",
    "eval_run": "klsweep.evaluate",
    "build_report": "klsweep.report",
    "KLSweepError": "klsweep.errors",
    "UserError": "klsweep.errors",
}

__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'klsweep' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # the next access is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
