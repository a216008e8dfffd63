"""Hugging Face caches built from local files, no network: a model in huggingface_hub's cache layout
(``models--<ns>--<name>/refs/main`` -> ``snapshots/<commit>/``, files as linked blobs) and a hub dataset prepared in
datasets' Arrow cache by datasets' own json builder, under the folder ``load_dataset`` looks up offline. ``populate``
fills a cache with what the shipped paper grid loads (``sweeps/paper.yaml``), each model a tiny random one."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

COMMIT = "0123456789abcdef0123456789abcdef01234567"
MODELS = ["Qwen/Qwen2.5-7B", "meta-llama/Llama-3.1-8B-Instruct", "Qwen/Qwen3-4B-Instruct-2507"]
_MMLU_ROW = {"question": "?", "subject": "s", "choices": ["a", "b", "c", "d"], "answer": 0}
DATASETS = [  # (repo, config, split, rows)
    (
        "DigitalLearningGmbH/MATH-lighteval",
        "default",
        "train",
        [{"problem": "1+1?", "solution": "\\boxed{2}"}],
    ),
    ("HuggingFaceH4/MATH-500", "default", "test", [{"problem": "1+1?", "answer": "2"}]),
    *[("cais/mmlu", f"college_{s}", "test", [_MMLU_ROW]) for s in ("physics", "chemistry", "biology")],
]


def cache_model(home: Path, repo: str, model_dir: Path, commit: str = COMMIT) -> Path:
    root = home / "hub" / f"models--{repo.replace('/', '--')}"
    snap = root / "snapshots" / commit
    snap.mkdir(parents=True)
    (root / "blobs").mkdir(exist_ok=True)
    for f in model_dir.iterdir():
        blob = root / "blobs" / f"{f.name}-{commit[:8]}"
        shutil.copyfile(f, blob)
        (snap / f.name).symlink_to(os.path.relpath(blob, snap))
    (root / "refs").mkdir(exist_ok=True)
    (root / "refs" / "main").write_text(commit)
    return snap


def cache_dataset(home: Path, repo: str, config: str, split: str, rows: list[dict], tmp: Path) -> None:
    from datasets.naming import camelcase_to_snakecase
    from datasets.packaged_modules.json.json import Json

    src = tmp / f"{repo.replace('/', '_')}-{config}.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    ns, name = repo.split("/")
    name = camelcase_to_snakecase(name)
    cache = home / "datasets"
    builder = Json(cache_dir=str(cache), dataset_name=name, config_name=config, config_id=config,
                   data_files={split: str(src)}, hash=COMMIT)  # fmt: skip
    builder.download_and_prepare()
    target = cache / f"{ns}___{name}" / config
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(str(cache / name / config), str(target))


def populate(home: Path, model_dir: Path, tmp: Path) -> None:
    for repo in MODELS:
        cache_model(home, repo, model_dir)
    for repo, config, split, rows in DATASETS:
        cache_dataset(home, repo, config, split, rows, tmp)
