"""The tiny tasks' dataset loader (``custom_dataset: !function utils.load_jsonl`` in ``_tiny_template_yaml``):
the ``dataset_kwargs.data_files`` of a task resolved against this folder rather than the working directory
(which is what datasets' json builder does), so ``lm_eval --include_path <this folder> --tasks tiny_add`` runs
from any folder, from a checkout or from an installed klsweep."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def load_jsonl(data_files: dict[str, str], **_: Any) -> Any:
    """``datasets.load_dataset("json", ...)`` of ``data_files`` ({split: file}), relative paths taken from this
    folder. lm-eval passes the task's metadata as further keyword arguments: ignored."""
    import datasets

    here = Path(__file__).resolve().parent
    return datasets.load_dataset("json", data_files={k: str(here / v) for k, v in data_files.items()})
