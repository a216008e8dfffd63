"""Whether a model folder's weights cover the model's parameters: what transformers would otherwise initialise at
random, and a run train from (a ``model.safetensors`` of the right format holding none of the model's tensors
loads without an error). Told by transformers itself: the folder loaded as a run loads it
(``AutoModelForCausalLM.from_pretrained``), onto the meta device (no tensor is read: the headers' names and
shapes only), with its loading report (``output_loading_info``): its missing keys are the parameters the
weights lack (tied weights and the keys a model declares optional are not missing). The verdict is kept in
``$KLSWEEP_CACHE/coverage/``, keyed by the stat of the folder's config and weight files, transformers' version
and this module (a load that failed is tried again): importing transformers and torch takes seconds, the check
of a folder seen before none.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from klsweep.errors import describe, parameters_missing


def uncovered(folder: Path, weights: list[str]) -> tuple[str, bool] | None:
    """Why the weight files ``weights`` of ``folder`` (an index and its shards, or one file: each whole) do not
    cover the parameters of the model its config.json describes ("missing 27 of the model's parameters
    (lm_head.weight, ...): ..."), and whether the model loaded (False: it did not, the words say why, and the
    config may be to blame as much as the weights); None when they do."""
    import hashlib
    import json
    from importlib.metadata import version

    from klsweep import store

    stats = []
    for name in ["config.json", *weights]:
        path = (folder / name).resolve()
        st = path.stat()
        stats.append([name, str(path), st.st_size, st.st_mtime_ns, st.st_ino])
    key = json.dumps([stats, version("transformers"), Path(__file__).read_text()])
    cache = store.cache_dir() / "coverage" / f"{hashlib.sha256(key.encode()).hexdigest()[:20]}.json"
    try:
        kept = json.loads(cache.read_text())["verdict"]
        if kept is None or (isinstance(kept[0], str) and isinstance(kept[1], bool)):
            return None if kept is None else (kept[0], kept[1])
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        pass
    verdict = _load_report(folder)
    if verdict is None or verdict[1]:  # a load that failed is not kept: it may not fail next time
        with contextlib.suppress(OSError):  # a read-only cache: checked again next time
            store.atomic_write_text(cache, json.dumps({"verdict": verdict}))
    return verdict


def _load_report(folder: Path) -> tuple[str, bool] | None:
    """The folder loaded onto the meta device as a run loads it; why its weights do not cover the model."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging

    verbosity, bars = logging.get_verbosity(), logging.is_progress_bar_enabled()
    logging.set_verbosity_error()  # its load report and progress bars: said here in one line
    logging.disable_progress_bar()
    try:
        _, info = AutoModelForCausalLM.from_pretrained(
            str(folder), device_map="meta", output_loading_info=True, local_files_only=True
        )
    except Exception as e:  # an architecture this transformers does not know, shapes that do not fit ...
        return f"does not load as a run loads it ({describe(e, max_lines=1, max_chars=160)})", False
    finally:
        logging.set_verbosity(verbosity)
        if bars:
            logging.enable_progress_bar()
    missing = sorted(info.get("missing_keys") or [])
    return (parameters_missing(missing), True) if missing else None
