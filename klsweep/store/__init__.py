"""The results store: where every run's files live and how they are read and written (one module per concern:
``layout`` the names, ``files`` reading and writing, ``metrics`` metrics.jsonl's one validator, ``checkpoints``,
``folders`` sweeps and runs, ``lock`` a run's training lock, ``kept`` derived data kept under ``cache_dir()`` by a
key and verified when read).

Layout (one sweep)::

    results/<sweep>/
        sweep.yaml                 the grid as planned (written by `klsweep run`)
        jobs.jsonl                 one line per submission: run id, kind (train|eval), cluster, job id, folder
        submitit/<stamp>/          submitit's own job files and logs, one folder per submission
        baseline/<model-id>/       the initial model, evaluated once per sweep (step 0)
            config.yaml
            eval/<eval-hash>/step-0/results.json, samples_<task>.jsonl
        <run-id>/
            config.yaml            the resolved RunConfig (what `klsweep train` reads)
            status.json            {"state", "step", "total_steps", "reason", "started_at", "updated_at", ...}
            env.json               the environment of the last training start (klsweep/environment.py)
            metrics.jsonl          one JSON object per optimiser step (the report's source of truth)
            checkpoints/checkpoint-<step>/   Hugging Face format (lm-eval loads it) + trainer state; the newest
                                     train.keep_checkpoints; the last holds FINAL_MARKER (done|diverged)
            checkpoints/unusable-checkpoint-<step>/   one cut short, set aside by a resume (checkpoint_problem)
            eval/<eval-hash>/<checkpoint-name>/results.json, samples_<task>.jsonl, results_<date>.json
                                   (lm-eval's own results file)
            wandb/offline-run-*/   W&B's files (offline; `wandb sync` uploads them), or run-*/ (online)
            logs/                  stdout/stderr of the jobs that worked on it: <kind>-<job id>.out|err
                                   (hard links of submitit's files, or the run's part copied; klsweep.submit.joblogs)
            .train.lock            flock'd, with the run folder, by the process training the run
                                   (``training``; its pid, host, job id)
        report/                    tables and plots (`klsweep report`)

A rehearsal's folder and its run folders hold ``REHEARSAL_MARKER``: the readers of a sweep refuse them
(``refuse_rehearsal``), whatever their runs' states say.

Every write goes through a temporary file and an atomic rename, so a reader never sees half a file; the
JSONL files are appended to line by line. What a reader does when a file is damaged anyway (a full disk, a copy
cut short, a hand edit): a JSONL line that is not a JSON object is skipped and counted (``scan_jsonl``), never
the rows after it; metrics.jsonl's rows are read through one validator (``metrics``: steps, order, values); a status.json that cannot be read raises ``UnreadableFile``, which names the file and what
to do, so that callers can set that one run aside and carry on with the others.
"""

from klsweep.store import files, folders, kept, layout, lock, metrics  # noqa: F401  (store.lock.TRAIN_LOCK_WAIT_S, ...)
from klsweep.store.checkpoints import (
    checkpoint_order,
    checkpoint_problem,
    checkpoint_step,
    checkpoints,
    drop_incomplete_checkpoints,
    evaluated_checkpoints,
    final_checkpoint,
    has_weights,
    newest_usable,
    set_aside_checkpoint,
    stale_end,
    unreadable_weights,
)
from klsweep.store.files import (
    REGULAR_TODO,
    STATUS_TODO,
    UnreadableFile,
    append_jsonl,
    atomic_write_text,
    disk_full,
    follow_umask,
    open_regular,
    read_bytes,
    read_json,
    read_jsonl,
    read_status,
    read_sweep_file,
    read_text,
    scan_jsonl,
    umask,
    write_json,
    write_status,
)
from klsweep.store.folders import (
    cache_dir,
    check_writable,
    links_out,
    not_a_folder,
    refuse_links_out,
    refuse_rehearsal,
    rehearsals_in,
    resolve_sweep,
    run_dirs,
    sweep_runs,
)
from klsweep.store.layout import (
    BASELINE_DIR,
    CHECKPOINTS_DIR,
    CONFIG_FILE,
    ENV_FILE,
    EVAL_DIR,
    FINAL_MARKER,
    FINAL_STATES,
    HF_WEIGHTS,
    JOBS_FILE,
    METRICS_FILE,
    REHEARSAL_MARKER,
    REPORT_DIR,
    STATES,
    STATUS_FILE,
    STOPPED_STATES,
    SWEEP_FILE,
    TRAIN_LOCK,
    TRAINED_STATES,
    TRAINER_STATE,
    UNUSABLE_PREFIX,
)
from klsweep.store.lock import (
    TRAIN_LOCK_WAIT_S,
    AlreadyTraining,
    LostTrainingLock,
    check_training,
    describe_trainer,
    trainer_of,
    training,
)
from klsweep.store.metrics import Metrics, cut_metrics, last_row, read_metrics

__all__ = [
    "STATES",
    "FINAL_STATES",
    "TRAINED_STATES",
    "STOPPED_STATES",
    "CONFIG_FILE",
    "STATUS_FILE",
    "METRICS_FILE",
    "ENV_FILE",
    "CHECKPOINTS_DIR",
    "EVAL_DIR",
    "JOBS_FILE",
    "SWEEP_FILE",
    "BASELINE_DIR",
    "REPORT_DIR",
    "FINAL_MARKER",
    "TRAIN_LOCK",
    "HF_WEIGHTS",
    "TRAINER_STATE",
    "REHEARSAL_MARKER",
    "UNUSABLE_PREFIX",
    "UnreadableFile",
    "STATUS_TODO",
    "atomic_write_text",
    "umask",
    "write_json",
    "REGULAR_TODO",
    "open_regular",
    "read_bytes",
    "read_text",
    "read_sweep_file",
    "read_json",
    "read_status",
    "write_status",
    "append_jsonl",
    "read_jsonl",
    "scan_jsonl",
    "Metrics",
    "read_metrics",
    "cut_metrics",
    "last_row",
    "disk_full",
    "follow_umask",
    "checkpoints",
    "has_weights",
    "checkpoint_problem",
    "newest_usable",
    "set_aside_checkpoint",
    "checkpoint_step",
    "final_checkpoint",
    "stale_end",
    "unreadable_weights",
    "evaluated_checkpoints",
    "checkpoint_order",
    "drop_incomplete_checkpoints",
    "run_dirs",
    "sweep_runs",
    "resolve_sweep",
    "rehearsals_in",
    "refuse_rehearsal",
    "not_a_folder",
    "check_writable",
    "cache_dir",
    "links_out",
    "refuse_links_out",
    "TRAIN_LOCK_WAIT_S",
    "AlreadyTraining",
    "describe_trainer",
    "training",
    "LostTrainingLock",
    "check_training",
    "trainer_of",
]
