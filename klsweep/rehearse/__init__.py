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

One module per concern: ``covering`` (which runs), ``standins`` (the tiny models, the shipped samples, the
wires checked), ``runconfig`` (a run's config, small), ``stages`` (train, resume, eval: each stage's outcome),
``folder`` (the marked, locked output folder), ``memory`` (what this machine must have free, said before
starting), ``findings`` (what the real run would refuse here), ``run`` (``rehearse``, ``rehearse_on_slurm``).
"""

from klsweep.rehearse.covering import COVERED, covered_values, covering_runs
from klsweep.rehearse.findings import real_run_findings
from klsweep.rehearse.folder import DEFAULT_OUT, MARKER, MARKER_TEXT
from klsweep.rehearse.run import Rehearsal, rehearse, rehearse_on_slurm
from klsweep.rehearse.runconfig import rehearsal_config
from klsweep.rehearse.stages import STAGES, RunRehearsal
from klsweep.rehearse.standins import TINY, tiny_model

__all__ = [
    "COVERED",
    "covered_values",
    "covering_runs",
    "real_run_findings",
    "DEFAULT_OUT",
    "MARKER",
    "MARKER_TEXT",
    "Rehearsal",
    "rehearse",
    "rehearse_on_slurm",
    "rehearsal_config",
    "STAGES",
    "RunRehearsal",
    "TINY",
    "tiny_model",
]
