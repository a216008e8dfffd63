"""Eval suites: ``klsweep/conf/eval/<suite>.yaml`` as an ``EvalSection``, their lm-eval tasks and the eval hash.

``builtin:<name>`` task folders ship in ``klsweep/evaltasks/``; ``eval_settings``/``eval_hash`` name the
``eval/<eval-hash>/`` folder (every setting that changes a score). See docs/DESIGN.md (evaluation).
"""

from __future__ import annotations

import atexit
import functools
import hashlib
import json
import os
import shutil
import stat
import tempfile
import threading
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from klsweep.config import EvalSection
from klsweep.errors import KLSweepError, Problem, UserError, not_loaded

CONF_DIR = Path(__file__).parent.parent / "conf" / "eval"
TASKS_DIR = Path(__file__).parent.parent / "evaltasks"
BACKENDS = ("hf", "vllm")
# EvalSection fields that do not change a score (left out of the eval hash).
_UNHASHED = ("batch_size", "tensor_parallel_size", "gpu_memory_utilization")


class EvalError(KLSweepError):
    """A run could not be evaluated (missing or broken checkpoint, lm-eval failure); recorded in the run."""


def _eval_section(data: Any) -> EvalSection:
    """An ``EvalSection`` from a (possibly partial) dict or OmegaConf node, the schema's defaults filling the rest."""
    from omegaconf import OmegaConf

    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(EvalSection), data))


def load_suite(name: str, config_dirs: Sequence[str | Path] = ()) -> EvalSection:
    """The suite ``<dir>/eval/<name>.yaml`` of the first of ``config_dirs`` (``--config-dir``) that has one, else
    ``klsweep/conf/eval/<name>.yaml``, as an ``EvalSection``."""
    from omegaconf import OmegaConf

    folders = [*(Path(d) / "eval" for d in config_dirs), CONF_DIR]
    path = next((f / f"{name}.yaml" for f in folders if (f / f"{name}.yaml").is_file()), None)
    if path is None:
        known = ", ".join(sorted({p.stem for f in folders for p in f.glob("*.yaml")}))
        raise UserError(Problem("--suite", f"no eval suite {name!r}", known))
    return _eval_section(OmegaConf.load(path))


def with_overrides(cfg: EvalSection, overrides: list[str]) -> EvalSection:
    """``cfg`` with ``eval.KEY=VALUE`` overrides (``klsweep eval``'s, values read as in a grid: ``eval.limit=150``,
    ``eval.ood=[tiny_sub]``); every bad one reported at once (exit 2)."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    fields = list(asdict(cfg))
    node = OmegaConf.structured(cfg)
    problems = []
    for text in overrides:
        name, eq, value = text.partition("=")
        key = name.strip().removeprefix("eval.")
        if not eq or not name.strip().startswith("eval.") or key not in fields:
            allowed = ", ".join(f"eval.{f}" for f in fields if f != "suite")
            problems.append(
                Problem(text, "not an eval.KEY=VALUE override", f"--suite NAME, or one of {allowed}")
            )
            continue
        if key == "suite":
            problems.append(Problem(text, "the suite is chosen by --suite", "--suite NAME"))
            continue
        try:
            node = OmegaConf.merge(node, OmegaConf.from_dotlist([f"{key}={value}"]))
        except OmegaConfBaseException as e:
            problems.append(Problem(text, str(e).splitlines()[0], f"a value of eval.{key}'s type"))
    if problems:
        raise UserError(problems, title="invalid eval overrides")
    return as_eval_section(OmegaConf.to_object(node))


def eval_label(settings: dict[str, Any], hash_: str | None) -> str:
    """Which eval a number comes from, in words: ``suite tiny, 100 problems per task, eval 1a2b3c4d5e`` (the
    report's tables, captions and figures, and ``klsweep eval``'s output say it)."""
    if hash_ is None:
        return "no eval"
    limit = settings.get("limit")
    parts = [f"suite {settings.get('suite', '?')}", f"{limit if limit else 'all'} problems per task"]
    if (settings.get("num_samples") or 1) > 1:
        parts.append(
            f"pass@1 of {settings['num_samples']} samples at temperature {settings.get('temperature')}"
        )
    return ", ".join([*parts, f"eval {hash_}"])


def as_eval_section(eval_cfg: EvalSection | dict[str, Any]) -> EvalSection:
    """An ``EvalSection`` from itself or from a (possibly partial) dict, validated."""
    cfg = eval_cfg if isinstance(eval_cfg, EvalSection) else _eval_section(dict(eval_cfg))
    problems = []
    if cfg.suite == "none" or not (cfg.in_domain or cfg.ood):
        problems.append(
            Problem("eval", f"suite {cfg.suite!r} names no tasks", "a suite such as tiny or paper")
        )
    if cfg.backend not in BACKENDS:
        problems.append(Problem("eval.backend", f"unknown backend {cfg.backend!r}", ", ".join(BACKENDS)))
    if cfg.num_samples < 1:
        problems.append(Problem("eval.num_samples", f"{cfg.num_samples}", "an integer >= 1"))
    if cfg.max_model_len is not None and cfg.max_model_len <= cfg.max_gen_toks:
        problems.append(
            Problem(
                "eval.max_model_len",
                f"{cfg.max_model_len} leaves no room for a prompt before {cfg.max_gen_toks} answer tokens",
                f"null or more than eval.max_gen_toks ({cfg.max_gen_toks}) plus the longest prompt",
            )
        )
    if not 0 < cfg.gpu_memory_utilization <= 1:
        problems.append(
            Problem("eval.gpu_memory_utilization", f"{cfg.gpu_memory_utilization}", "a fraction in (0, 1]")
        )
    if cfg.num_samples > 1 and cfg.temperature <= 0:
        problems.append(
            Problem("eval.num_samples", "several samples of greedy decoding are identical", "temperature > 0")
        )
    overlap = sorted(set(cfg.in_domain) & set(cfg.ood))
    if overlap:
        problems.append(
            Problem("eval.ood", f"task(s) {overlap} are also in eval.in_domain", "disjoint lists")
        )
    if problems:
        raise UserError(problems, title="invalid eval settings")
    return cfg


def include_dir(include_path: str | None) -> Path | None:
    """The folder of custom task YAMLs named by ``include_path`` (``builtin:<name>``: shipped with klsweep)."""
    if not include_path:
        return None
    if include_path.startswith("builtin:"):
        folder = TASKS_DIR / include_path.removeprefix("builtin:")
        if not folder.is_dir():
            known = ", ".join(f"builtin:{p.name}" for p in sorted(TASKS_DIR.iterdir()) if p.is_dir())
            raise UserError(Problem("eval.include_path", f"no shipped task folder {include_path!r}", known))
        return folder
    folder = Path(include_path).expanduser()
    if not folder.is_dir():
        raise UserError(
            Problem("eval.include_path", f"no such folder: {folder}", "builtin:<name> or a folder")
        )
    return folder


def _task_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file() and "__pycache__" not in p.parts)


def _digest(folder: Path | None) -> str | None:
    if folder is None:
        return None
    h = hashlib.sha256()
    for p in _task_files(folder):
        h.update(str(p.relative_to(folder)).encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def _absolutise(data_files: Any, base: Path) -> Any:
    if isinstance(data_files, str):
        p = Path(data_files).expanduser()
        return data_files if p.is_absolute() or "://" in data_files else str(base / p)
    if isinstance(data_files, list):
        return [_absolutise(x, base) for x in data_files]
    if isinstance(data_files, dict):
        return {k: _absolutise(v, base) for k, v in data_files.items()}
    return data_files


# (the source folder's resolved path, its digest) -> this process's private copy of it
_COPIES: dict[tuple[str, str | None], Path] = {}
_COPIES_LOCK = threading.Lock()


def materialise_tasks(folder: Path) -> Path:
    """A copy of the task folder where each ``dataset_kwargs.data_files`` is absolute (datasets resolves
    relative data files against the working directory, not the YAML), pointing into ``folder``.

    lm-eval imports the copy's Python files (``!function utils.load_jsonl``), so the copy is this process's own:
    a folder ``mkdtemp`` creates anew (mode 0700, an unpredictable name) in the temporary folder and this
    process fills; never a folder found there, which another user of a shared ``/tmp`` could have planted. It is
    made once per process and task content, and removed when the process exits."""
    key = (str(folder.resolve()), _digest(folder))
    with _COPIES_LOCK:
        copy = _COPIES.get(key)
        if copy is None or not _still_ours(copy):
            copy = _COPIES[key] = _private_copy(folder)
    return copy


def _private_copy(folder: Path) -> Path:
    import yaml

    copy = Path(tempfile.mkdtemp(prefix=f"klsweep-evaltasks-{folder.name}-"))
    atexit.register(_remove_copy, copy, os.getpid())
    for src in _task_files(folder):
        dst = copy / src.relative_to(folder)
        dst.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        shutil.copyfile(src, dst)
        if not (src.name.endswith(".yaml") or src.name.endswith("_yaml")):
            continue
        try:
            cfg = yaml.safe_load(src.read_text())
        except yaml.YAMLError:  # lm-eval tags (!function): no data files to fix here
            continue
        files = cfg.get("dataset_kwargs", {}).get("data_files") if isinstance(cfg, dict) else None
        if files is not None:
            cfg["dataset_kwargs"]["data_files"] = _absolutise(files, src.parent)
            dst.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return copy


def _still_ours(copy: Path) -> bool:
    """The copy is still the folder ``mkdtemp`` made: not a link, this user's, shut to everyone else."""
    try:
        st = copy.lstat()
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & 0o077


def _remove_copy(copy: Path, owner_pid: int) -> None:
    if os.getpid() == owner_pid:  # not a forked child's exit: the copy is its parent's
        shutil.rmtree(copy, ignore_errors=True)


def _task_manager(eval_cfg: EvalSection) -> Any:
    """A TaskManager that knows every task of the suite; lm-eval's built-in tasks are indexed (~6 s) only when
    the suite names one that the include folder lacks."""
    from lm_eval.tasks import TaskManager

    folder = include_dir(eval_cfg.include_path)
    include = str(materialise_tasks(folder)) if folder is not None else None
    names = [*eval_cfg.in_domain, *eval_cfg.ood]
    if include is not None:
        tm = TaskManager(include_path=include, include_defaults=False)
        if all(n in tm.all_tasks for n in names):
            return tm
    tm = TaskManager(include_path=include, include_defaults=True)
    missing = [n for n in names if n not in tm.all_tasks]
    if missing:
        raise UserError(
            [
                Problem("eval", f"no lm-eval task {n!r} (include_path={eval_cfg.include_path!r})")
                for n in missing
            ],
            title=f"unknown tasks in suite {eval_cfg.suite!r}",
        )
    return tm


def resolve_tasks(eval_cfg: EvalSection | dict[str, Any]) -> dict[str, str]:
    """``{task name: its YAML}`` for every task of the suite, from lm-eval's task index alone (no download);
    a ``UserError`` names each task that does not exist."""
    cfg = as_eval_section(eval_cfg)
    tm = _task_manager(cfg)
    return {n: str(tm.task_index[n].yaml_path) for n in [*cfg.in_domain, *cfg.ood]}


def lm_eval_version() -> str:
    from importlib.metadata import version

    return version("lm_eval")


def eval_settings(eval_cfg: EvalSection) -> dict[str, Any]:
    """The settings that decide a score (what the eval hash covers): the suite's fields but the batch size and
    the parallelism and vLLM's memory, and a digest of the custom task files. The same for every model of a sweep, so a sweep
    has one hash per suite (``apply_chat_template``: null follows each model's ``model.chat_template``, the
    decision its training used; results.json records what was done as ``chat_template_applied``)."""
    settings = {k: v for k, v in asdict(eval_cfg).items() if k not in _UNHASHED}
    if settings["max_model_len"] is None:  # the model's own: the hashes of evals from before the key stand
        del settings["max_model_len"]
    settings["tasks_digest"] = _digest(include_dir(eval_cfg.include_path))
    return settings


def eval_hash(settings: dict[str, Any]) -> str:
    """Short hash of the settings and lm-eval's version: the name of the ``eval/<eval-hash>/`` folder."""
    blob = json.dumps({"settings": settings, "lm_eval": lm_eval_version()}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:10]


@dataclass
class Suite:
    """The suite's lm-eval tasks, loaded once (data included) and reused for every model."""

    cfg: EvalSection
    manager: Any = None  # lm-eval's TaskManager (simple_evaluate builds a full one, ~6 s, when given none)
    tasks: dict[str, Any] = field(default_factory=dict)

    @functools.cached_property
    def settings(self) -> dict[str, Any]:
        """``eval_settings`` of the suite (digests the task files), once per suite rather than per run."""
        return eval_settings(self.cfg)

    @functools.cached_property
    def hash(self) -> str:
        return eval_hash(self.settings)

    def load(self) -> None:
        if not self.tasks:
            self.manager = _task_manager(self.cfg)
            names = [*self.cfg.in_domain, *self.cfg.ood]
            try:
                self.tasks = self.manager.load(names)["tasks"]
            except (OSError, ConnectionError, ValueError) as e:  # a dataset not cached offline, gated, ...
                raise not_loaded(f"the data of eval task(s) {', '.join(names)}", e) from e
