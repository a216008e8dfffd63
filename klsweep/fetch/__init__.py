"""What a sweep needs from the Hugging Face hub, whether the local caches hold it, and fetching it.

``needs(configs)`` lists every model (a hub id at ``model.revision``), training set (``task.dataset``) and eval
set (the ``dataset_path``/``dataset_name`` of each lm-eval task of the suite) that runs need; ``check`` looks
for each in the caches without the network (huggingface_hub's cache under ``HF_HUB_CACHE``, datasets' Arrow
cache under ``HF_DATASETS_CACHE``: what the loaders read under ``HF_HUB_OFFLINE=1``/``HF_DATASETS_OFFLINE=1``)
and calls it cached only when what a run loads is there whole (``model_problems``, ``dataset_problems``);
``fetch`` downloads what is missing or incomplete (``snapshot_download``, ``datasets.load_dataset``), after
one look at whether the hub answers (``hub_unreachable``). ``require_cached`` is the offline clusters' check
(``cluster.offline`` or ``HF_HUB_OFFLINE=1``): a ``UserError`` naming everything missing or incomplete and
the ``klsweep fetch`` command. ``pin_revisions`` records the commit each hub model resolved to in the runs'
configs; ``recorded_revisions`` reads them back, for the checks. See
docs/CLUSTER.md and slurm/README.md.

One module per concern: ``needs`` (what runs load), ``caches`` (what the local caches hold, checked to load;
``coverage``: a model's weights cover its parameters),
``revisions`` (the commits runs load), ``refusal`` (the offline refusal), ``download`` (fetching).
"""

from klsweep.fetch.caches import (
    NODE_LOCAL_ENV,
    NODE_LOCAL_ROOTS,
    Found,
    check,
    check_model,
    dataset_problems,
    datasets_cache,
    hub_cache,
    hub_folder,
    model_problems,
    node_local_root,
    node_local_warnings,
)
from klsweep.fetch.download import IGNORED_FILES, fetch, hub_page, hub_unreachable, size_text
from klsweep.fetch.needs import OFFLINE_ENV, Need, needs, offline, task_yaml
from klsweep.fetch.refusal import (
    cache_refusals,
    fetch_command,
    job_environment,
    require_cached,
    require_cached_for_eval,
)
from klsweep.fetch.revisions import pin_revisions, plan_configs, recorded_revisions

__all__ = [
    "Need",
    "Found",
    "OFFLINE_ENV",
    "IGNORED_FILES",
    "NODE_LOCAL_ROOTS",
    "NODE_LOCAL_ENV",
    "offline",
    "needs",
    "task_yaml",
    "hub_cache",
    "datasets_cache",
    "node_local_root",
    "node_local_warnings",
    "check",
    "check_model",
    "hub_folder",
    "model_problems",
    "dataset_problems",
    "fetch_command",
    "cache_refusals",
    "require_cached",
    "require_cached_for_eval",
    "job_environment",
    "plan_configs",
    "recorded_revisions",
    "pin_revisions",
    "hub_page",
    "hub_unreachable",
    "fetch",
    "size_text",
]
