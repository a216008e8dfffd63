"""What a rehearsal needs of this machine's memory, said before it starts (``check_memory``).

vLLM's engines on a CPU (TRL's colocate engine of each training stage, lm-eval's of each eval) take their KV cache
when they start, sized by ``engines.cpu_kv_cache`` to what the stand-ins need (a few MiB: the CPU build's least,
1 GiB), and refuse to start where it is not free. A login node, where rehearsals run, is always busy: where the
memory free (``MemAvailable``) is less than the process and one engine's cache need, the rehearsal is refused
before anything is written, with both numbers, instead of failing every stage minutes later. Without vLLM (HF
generate, lm-eval's hf) or on a GPU nothing is reserved up front: nothing is checked.
"""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from klsweep import engines
from klsweep.errors import Problem, UserError
from klsweep.rehearse.runconfig import rehearsal_config
from klsweep.rehearse.standins import TINY

# The rehearsal's process itself, its vLLM KV caches aside: `klsweep rehearse sweeps/paper.yaml` with vLLM's CPU
# build peaked at 5.1 GiB resident (1 GiB of it an engine's cache; lm-eval's engine process, 1.8 GiB, ran
# while this one held 2.2), on a 2-core x86-64 machine
PROCESS_GIB = 4.0
MEMINFO = "/proc/meminfo"


def free_gib(meminfo: str | None = None) -> float | None:
    """The memory the kernel says can be had without swapping (``MemAvailable``), GiB; None where not Linux."""
    try:
        for line in Path(meminfo or MEMINFO).read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024 / engines.GIB
    except (OSError, ValueError, IndexError):
        return None
    return None


def engine_cache_gib(configs: list[dict[str, Any]]) -> int:
    """The largest KV cache (GiB) of the vLLM engines the rehearsed runs' configs start on a CPU (0: none):
    what ``engines.cpu_kv_cache`` gives the stand-ins (``rehearse.TINY``), or what ``VLLM_CPU_KVCACHE_SPACE``
    sets."""
    stand_in = SimpleNamespace(**TINY)
    needs = []
    for config in configs:
        train, ev = config["train"], config.get("eval", {})
        if train.get("use_vllm"):
            length = int(train["max_prompt_length"]) + int(train["max_completion_length"])
            batch = int(train["prompts_per_step"]) * int(train["group_size"])  # one process generates it all
            needs.append(engines.kv_cache_bytes(stand_in, length, batch))
        if ev.get("backend") == "vllm" and ev.get("suite", "none") != "none":
            length = int(ev.get("max_model_len") or TINY["max_position_embeddings"])
            needs.append(engines.kv_cache_bytes(stand_in, length, int(ev.get("batch_size", 1))))
    if not needs:
        return 0
    if os.environ.get(engines.KV_CACHE_VARIABLE):
        return int(os.environ[engines.KV_CACHE_VARIABLE])
    return engines.kv_cache_gib(max(needs))


def check_memory(runs: list[Any], gpus: int, free: float | None = None) -> None:
    """``UserError`` when the rehearsed ``runs`` (planned runs) start vLLM engines on this machine's CPU and the
    memory free (``free``, else ``free_gib()``) is less than the process (``PROCESS_GIB``) and the largest
    engine's KV cache need."""
    if gpus:
        return
    configs = [rehearsal_config(r.config, Path("stand-in"), Path("tasks"), gpus)[0] for r in runs]
    cache = engine_cache_gib(configs)
    free = free_gib() if free is None else free
    if not cache or free is None or free >= PROCESS_GIB + cache:
        return
    raise UserError(
        Problem(
            "this machine's memory",
            f"{free:.1f} GiB free, but the rehearsal needs about {PROCESS_GIB + cache:.0f} GiB: its process "
            f"~{PROCESS_GIB:.0f} GiB and the KV cache each vLLM engine on the CPU takes when it starts, "
            f"{cache} GiB ({engines.KV_CACHE_VARIABLE}; a stand-in needs a few MiB, the CPU build's least "
            "is 1 GiB)",
            "free memory here (other work holds it), or rehearse on a compute node: --cluster slurm",
        ),
        title="not enough memory free for the rehearsal",
    )
