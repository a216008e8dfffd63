"""The project's own tiny causal LM: a ByteLevel BPE tokenizer and a small Qwen2 model, warm-started by a short SFT
on the tiny task mix (``klsweep.tasks``), built once and cached. No downloads: tests and the local demo study
run offline on a CPU.

- ``tiny_model_path()`` is the model that ships with klsweep (``klsweep/assets/tiny-model/``: weights,
  tokenizer, config, ``build_info.json``), its files checked against ``SHA256SUMS`` at first use, so every
  machine starts from the same weights (the SFT's numbers differ between CPU kinds, so a model built here would
  not). ``python -m klsweep.tinymodel DIR`` rebuilds it into DIR (``klsweep/assets/tiny-model`` to update what
  ships); ``tests/integration/test_tinymodel.py`` checks that the build reproduces the shipped files on a CPU of the kind
  that built them. Other specs (``tiny_model_path(cache_dir, spec)``) are built once and cached under
  ``$KLSWEEP_CACHE/tiny/<hash>/`` (default ``~/.cache/klsweep``; the hash covers the spec, this module's and
  ``tasks.py``'s source and the torch/transformers versions; a file lock serialises concurrent builders, and a
  folder is renamed into place whole).
- ``resolve_model_path(model)`` maps ``model.path == "tiny"`` to that folder and leaves hub ids and paths alone.
- ``random_tiny_model(folder)`` saves an untrained tiny model and tokenizer (for fast unit tests).

The SFT (AdamW, lr warm-up, gradient clipping; every batch an equal share of each skill) is stopped as soon as
greedy accuracy on the in-domain skill (addition, checked on training-pool problems) reaches
``TinySpec.target_accuracy``, so that RL has signal to work with: neither 0 nor 100%, with the out-of-domain
skills partly learned. The build is deterministic given the spec (single-threaded, seeded).

Pitfall (transformers 5.x): for model_type qwen2, ``AutoTokenizer`` always builds ``Qwen2Tokenizer`` from the
saved vocab and merges with Qwen2's own pre-tokeniser (digits split one by one), ignoring the saved pipeline; the
BPE is therefore trained with that same pre-tokeniser, so what it learns is what is used after reloading.
"""

from __future__ import annotations

import functools
import hashlib
import json
import platform
import re
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from klsweep import environment, store, tasks

if TYPE_CHECKING:
    from klsweep.config import ModelSection

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
# Qwen2's pre-tokeniser split pattern (what Qwen2Tokenizer uses after reloading).
_QWEN2_SPLIT = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"


@dataclass(frozen=True)
class TinySpec:
    """What the tiny model is; every field enters the cache hash."""

    vocab_size: int = 300
    hidden_size: int = 64
    intermediate_size: int = 256
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    max_position_embeddings: int = 256
    seed: int = 0
    sft_batch_size: int = 64
    sft_learning_rate: float = 3e-3
    sft_warmup_steps: int = (
        100  # linear warm-up; without it (and without clipping) the loss spikes at this lr
    )
    sft_max_grad_norm: float = 1.0
    sft_max_steps: int = 1500
    check_every: int = 25
    check_size: int = 100  # training-pool problems per accuracy check
    # Stop the SFT when greedy accuracy on the in-domain skill (training-pool problems), averaged over the last 2
    # checks, reaches this: ~300 steps, where the held-out accuracy is ~0.3-0.5 and still rising fast.
    target_accuracy: float = 0.35


SHIPPED = Path(__file__).parent / "assets" / "tiny-model"
CHECKSUMS = "SHA256SUMS"
BUILD_INFO = "build_info.json"


class TinyModelError(RuntimeError):
    """The shipped tiny model's files do not match their checksums."""


def default_cache_dir() -> Path:
    return store.cache_dir()


def _tokenizer_corpus() -> list[str]:
    texts = []
    for skill in tasks.SKILLS:
        for row in tasks.tiny_problems(skill, "train", 300, seed=0):
            texts.append(f"{row['prompt']}{row['answer']}<|im_end|>\n")
    texts.append("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n")
    return texts


def build_tokenizer(spec: TinySpec = TinySpec()) -> Any:
    """A ByteLevel BPE (Qwen2 pre-tokeniser, ChatML template) trained on the tiny task text, as a
    ``PreTrainedTokenizerFast``: eos ``<|im_end|>``, pad ``<|endoftext|>``."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_QWEN2_SPLIT), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=spec.vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_tokenizer_corpus(), trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        chat_template=CHATML_TEMPLATE,
        model_max_length=spec.max_position_embeddings,
    )


def _new_model(
    spec: TinySpec, tokenizer: Any, vocab_size: int | None = None, device: str | None = None
) -> Any:
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(spec.seed)
    config = Qwen2Config(
        vocab_size=vocab_size or len(tokenizer),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        max_position_embeddings=spec.max_position_embeddings,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        dtype="float32",
    )
    with torch.device(device or "cpu"):
        model = Qwen2ForCausalLM(config)
    end_ids = [tokenizer.eos_token_id, tokenizer.pad_token_id]
    model.generation_config = GenerationConfig(eos_token_id=end_ids, pad_token_id=tokenizer.pad_token_id)
    return model


def _save(model: Any, tokenizer: Any, folder: Path) -> None:
    from transformers.utils import logging as hf_logging

    bar = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # no stray "Writing model shards" bar for a one-file model
    try:
        model.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
    finally:
        if bar:
            hf_logging.enable_progress_bar()


def random_tiny_model(
    folder: Path, spec: TinySpec = TinySpec(), vocab_size: int | None = None, device: str | None = None
) -> Path:
    """Save an untrained (randomly initialised) Qwen2 model of ``spec``'s shape and the tiny tokenizer in
    ``folder`` (created) and return it. ``vocab_size`` sets the embedding rows (default: the tokenizer's; a
    real LLM's, e.g. 151936, gives its memory footprint; ids past the tokenizer decode to nothing);
    ``device`` is where the weights are initialised (a GPU builds billions of parameters in seconds)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(spec)
    _save(_new_model(spec, tokenizer, vocab_size, device), tokenizer, folder)
    return folder


def generate_answers(
    model: Any,
    tokenizer: Any,
    prompts: list[str],
    temperature: float = 0.0,
    max_new_tokens: int = 8,
    seed: int = 0,
) -> list[str]:
    """Completions of chat-templated ``prompts`` (greedy when ``temperature == 0``), cut at the first end token."""
    import torch

    tokenizer.padding_side = "left"
    batch = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    sampling = (
        {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0}
        if temperature > 0
        else {"do_sample": False}
    )
    torch.manual_seed(seed)
    with torch.no_grad():
        out = model.generate(**batch, max_new_tokens=max_new_tokens, **sampling)
    texts = tokenizer.batch_decode(out[:, batch["input_ids"].shape[1] :], skip_special_tokens=False)
    return [tasks.extract_tiny_answer(t) for t in texts]


def skill_accuracy(
    model: Any,
    tokenizer: Any,
    skill: str,
    split: str = "eval",
    n: int = 150,
    temperature: float = 0.0,
    seed: int = 0,
) -> float:
    """Fraction of ``n`` problems of ``skill`` (from ``split``) the model answers exactly."""
    rows = tasks.tiny_problems(skill, split, n, seed)
    answers = generate_answers(
        model, tokenizer, [r["prompt"] for r in rows], temperature=temperature, seed=seed
    )
    return sum(a == r["answer"] for a, r in zip(answers, rows, strict=True)) / len(rows)


def _sft_examples(tokenizer: Any, skill: str) -> list[tuple[list[int], int]]:
    """(token ids of prompt + answer + <|im_end|>, prompt length) for every training-pool problem of ``skill``."""
    rows = tasks.tiny_problems(skill, "train", None, seed=0)
    prompts = tokenizer([r["prompt"] for r in rows], add_special_tokens=False)["input_ids"]
    answers = tokenizer([r["answer"] + "<|im_end|>" for r in rows], add_special_tokens=False)["input_ids"]
    return [(p + a, len(p)) for p, a in zip(prompts, answers, strict=True)]


def _warm_start(model: Any, tokenizer: Any, spec: TinySpec) -> dict[str, Any]:
    """Train on the skill mix until greedy in-domain accuracy reaches the target; return a log of the run."""
    import torch

    # Each skill gets an equal share of every batch, whatever the size of its pool.
    pools = [_sft_examples(tokenizer, skill) for skill in tasks.SKILLS]
    gen = torch.Generator().manual_seed(spec.seed)
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=spec.sft_learning_rate, betas=(0.9, 0.98), weight_decay=0.0
    )
    pad = tokenizer.pad_token_id
    history = []
    step = 0
    for step in range(1, spec.sft_max_steps + 1):
        model.train()
        batch = [
            pools[k % len(pools)][i]
            for k in range(spec.sft_batch_size)
            for i in torch.randint(len(pools[k % len(pools)]), (1,), generator=gen).tolist()
        ]
        width = max(len(seq) for seq, _ in batch)
        ids = torch.full((len(batch), width), pad)
        labels = torch.full((len(batch), width), -100)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for row, (seq, n_prompt) in enumerate(batch):
            ids[row, : len(seq)] = torch.tensor(seq)
            labels[row, n_prompt : len(seq)] = torch.tensor(seq[n_prompt:])
            mask[row, : len(seq)] = 1
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), spec.sft_max_grad_norm)
        for group in optimizer.param_groups:
            group["lr"] = spec.sft_learning_rate * min(1.0, step / max(1, spec.sft_warmup_steps))
        optimizer.step()
        optimizer.zero_grad()
        if step % spec.check_every == 0:
            model.eval()
            acc = skill_accuracy(
                model, tokenizer, tasks.IN_DOMAIN_SKILL, split="train", n=spec.check_size, seed=step
            )
            history.append({"step": step, "loss": round(loss.item(), 4), "train_accuracy": acc})
            recent = [h["train_accuracy"] for h in history[-2:]]
            if len(recent) == 2 and sum(recent) / 2 >= spec.target_accuracy:  # one check alone is noisy
                break
    model.eval()
    return {"sft_steps": step, "sft_history": history}


def _spec_hash(spec: TinySpec) -> str:
    import torch
    import transformers

    here = Path(__file__).parent
    h = hashlib.sha256(json.dumps(asdict(spec), sort_keys=True).encode())
    for source in (here / "tinymodel.py", here / "tasks.py"):
        h.update(source.read_bytes())
    h.update(f"torch={torch.__version__} transformers={transformers.__version__}".encode())
    return h.hexdigest()[:12]


def build_tiny_model(folder: Path, spec: TinySpec = TinySpec()) -> dict[str, Any]:
    """Build the warm-started tiny model into ``folder`` and return its build info (also saved as
    ``build_info.json``): SFT steps, build wall and CPU time, greedy and sampled (temperature 1) accuracy per skill."""
    import torch

    start, cpu_start = time.time(), time.process_time()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # faster for a model this small, and much faster on a shared machine
    try:
        tokenizer = build_tokenizer(spec)
        model = _new_model(spec, tokenizer)
        info: dict[str, Any] = {"spec": asdict(spec), **_warm_start(model, tokenizer, spec)}
    finally:
        torch.set_num_threads(threads)
    info["accuracy"] = {
        skill: {
            "greedy": skill_accuracy(model, tokenizer, skill),
            "sampled": skill_accuracy(model, tokenizer, skill, temperature=1.0),
        }
        for skill in tasks.SKILLS
    }
    info["num_parameters"] = sum(p.numel() for p in model.parameters())
    info["build_seconds"] = round(time.time() - start, 2)
    info["build_cpu_seconds"] = round(time.process_time() - cpu_start, 2)
    info["cpu_kernels"] = torch.backends.cpu.get_cpu_capability()
    info["machine"] = platform.machine()
    info["cpu_vendor"] = environment.cpu_vendor()
    _save(model, tokenizer, folder)
    (folder / BUILD_INFO).write_text(json.dumps(info, indent=2) + "\n")
    return info


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def write_checksums(folder: Path) -> Path:
    """Write ``folder/SHA256SUMS`` (``sha256sum``'s format) over every other file in ``folder``."""
    files = sorted(p for p in Path(folder).iterdir() if p.is_file() and p.name != CHECKSUMS)
    path = Path(folder) / CHECKSUMS
    path.write_text("".join(f"{_sha256(p)}  {p.name}\n" for p in files))
    return path


def read_checksums(folder: Path) -> dict[str, str]:
    """``SHA256SUMS`` of ``folder`` as {file name: sha256}; ``TinyModelError`` when it is missing, empty, or a
    line is not ``<64 hex digits>  <name>`` (a name listed twice included)."""
    path = Path(folder) / CHECKSUMS
    try:
        lines = path.read_text().splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise TinyModelError(_damaged(folder, f"its {CHECKSUMS} cannot be read ({e})")) from e
    sums: dict[str, str] = {}
    for number, line in enumerate(lines, 1):
        match = re.fullmatch(r"([0-9a-f]{64}) [ *]([^/\\]+)", line)
        if match is None or match[2] in sums:
            raise TinyModelError(
                _damaged(folder, f"line {number} of its {CHECKSUMS} is not `<sha256>  <file>`")
            )
        sums[match[2]] = match[1]
    if not sums:
        raise TinyModelError(_damaged(folder, f"its {CHECKSUMS} lists no file"))
    return sums


def _damaged(folder: Path, what: str) -> str:
    return (
        f"the tiny model in {folder} cannot be trusted: {what}; reinstall klsweep, or rebuild it with "
        f"`python -m klsweep.tinymodel {folder}`"
    )


def verified(folder: Path) -> Path:
    """``folder``, after checking it is exactly what its ``SHA256SUMS`` lists: every file listed is there with
    its hash, and no other file is (``TinyModelError`` naming what differs). A missing, empty or partial
    ``SHA256SUMS`` is refused, not taken as fewer files to check."""
    sums = read_checksums(folder)
    present = {p.name for p in Path(folder).iterdir() if p.name != CHECKSUMS}
    bad = [
        f"{name} differs" if (folder / name).is_file() else f"{name} missing"
        for name, digest in sums.items()
        if not (folder / name).is_file() or _sha256(folder / name) != digest
    ]
    bad += [f"{name} not listed" for name in sorted(present - set(sums))]
    if bad:
        raise TinyModelError(_damaged(folder, f"it does not match its {CHECKSUMS} ({', '.join(bad)})"))
    return folder


@functools.cache
def shipped_model_path() -> Path:
    """The tiny model that ships with klsweep, checked against its ``SHA256SUMS`` (once a process)."""
    return verified(SHIPPED)


def tiny_model_path(
    cache_dir: Path | None = None,
    spec: TinySpec = TinySpec(),
    on_build: Callable[[Path], None] | None = None,
) -> Path:
    """The folder of the warm-started tiny model, loadable offline by ``AutoModelForCausalLM``/
    ``AutoTokenizer.from_pretrained`` and by lm-eval's ``hf`` model: the shipped one for the default spec;
    another spec's is built on first use, then reused. ``on_build`` is called with that folder before a build
    (about 15 s on a CPU), to say what is happening."""
    from filelock import FileLock

    if spec == TinySpec():
        return shipped_model_path()
    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    root = root / "tiny"
    final = root / _spec_hash(spec)
    if (final / "build_info.json").is_file():
        return final
    root.mkdir(parents=True, exist_ok=True)
    with FileLock(str(final) + ".lock"):
        if (final / "build_info.json").is_file():  # another process built it while we waited
            return final
        if on_build is not None:
            on_build(final)
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}-", dir=root))
        try:
            build_tiny_model(tmp, spec)
            if final.exists():  # a leftover without build_info.json: incomplete
                shutil.rmtree(final)
            tmp.rename(final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return final


def resolve_model_path(model: ModelSection) -> str:
    """``model.path`` as ``from_pretrained`` takes it: "tiny" becomes the cached tiny model's folder; a hub id or
    a local path is returned unchanged."""
    return str(tiny_model_path()) if model.path == "tiny" else model.path


def main(argv: list[str] | None = None) -> None:
    """``python -m klsweep.tinymodel DIR``: build the default tiny model into DIR with its ``SHA256SUMS``."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m klsweep.tinymodel", description=main.__doc__)
    parser.add_argument("folder", type=Path, help=f"where to build it ({SHIPPED} updates what ships)")
    folder = parser.parse_args(argv).folder
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.iterdir():
        if old.is_file():
            old.unlink()
    info = build_tiny_model(folder)
    write_checksums(folder)
    print(f"built in {folder} ({info['sft_steps']} SFT steps, CPU kernels {info['cpu_kernels']})")


if __name__ == "__main__":
    main()
