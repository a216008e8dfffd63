"""klsweep.fastgen against HF generate on the shipped tiny model: the same tokens for a seed (sampled and
greedy, left padding, every warper the trainer passes, repetition penalty, stop strings, eos), the lean
forward's logits equal to the model's own forward step by step and its log-probs to a plain forward over the
whole sequence, the sampled first and second tokens distributed as the exact softmax of independently computed
warped logits (chi-square), and the plan's choice of path without torch."""

from __future__ import annotations

import math

import pytest

from klsweep import fastgen

torch = pytest.importorskip("torch")

# the tiny task's prompts: different lengths, so that the batch is left-padded
PAIRS = [(1, 2), (13, 4), (7, 55), (120, 3)]


@pytest.fixture(scope="module")
def tiny():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from klsweep.tinymodel import tiny_model_path

    path = tiny_model_path()
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    threads = torch.get_num_threads()
    # as a run's job sets them: a tiny model's ops on several threads crawl under load
    torch.set_num_threads(1)
    yield model, AutoTokenizer.from_pretrained(path)
    torch.set_num_threads(threads)


def prompts(tokenizer, pairs=PAIRS, repeat: int = 4):
    rows = []
    for a, b in pairs:
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": f"{a}+{b}="}], add_generation_prompt=True
        )
        rows += [list(ids if isinstance(ids, list) else ids["input_ids"])] * repeat
    width = max(map(len, rows))
    ids = torch.tensor([[0] * (width - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    return ids, mask


def settings(**overrides):
    """The GenerationConfig TRL's GRPOTrainer builds for HF generate (its defaults), with ``overrides``."""
    from transformers import GenerationConfig

    given = dict(
        max_new_tokens=6,
        do_sample=True,
        pad_token_id=0,
        bos_token_id=None,
        eos_token_id=[2, 0],
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        min_p=None,
        repetition_penalty=1.0,
        cache_implementation=None,
    )
    given.update(overrides)
    return GenerationConfig(**given, disable_compile=True)


SETTINGS = {
    "trl defaults": {},
    "temperature": dict(temperature=0.7),
    "top-p and top-k": dict(top_p=0.8, top_k=5, temperature=1.3),
    "min-p": dict(min_p=0.1),
    "repetition penalty": dict(repetition_penalty=3.0, max_new_tokens=8),
    "greedy": dict(do_sample=False),
    "stop strings": dict(stop_strings=["\n", "1"], max_new_tokens=10),
    "no eos, long": dict(eos_token_id=None, temperature=1.5, max_new_tokens=12),
}


# the model's own forward (any causal LM, opt-in) on two settings: the loop is the same
CASES = [(name, "lean") for name in SETTINGS] + [("trl defaults", "model"), ("stop strings", "model")]


@pytest.mark.parametrize(("name", "forward"), CASES)
def test_the_same_tokens_as_hf_generate(tiny, name, forward):
    """For each seed the very ids HF generate returns (finished rows padded as it pads them), and the global
    generator left where generate leaves it; with a padded and an unpadded batch."""
    model, tokenizer = tiny
    config = settings(**SETTINGS[name])
    generator = fastgen.Generator(model, config, tokenizer, forward=forward)
    assert generator.lean == (forward == "lean")
    for ids, mask in (prompts(tokenizer), prompts(tokenizer, [(11, 22), (33, 44)], 3)):
        for seed in range(3):
            torch.manual_seed(seed)
            with torch.no_grad():
                expected = model.generate(
                    input_ids=ids, attention_mask=mask, generation_config=config, tokenizer=tokenizer
                )
            after = torch.rand(1)
            torch.manual_seed(seed)
            got = generator(ids, mask)
            assert torch.equal(got, expected), (name, seed)
            assert torch.equal(torch.rand(1), after)


def test_any_causal_lm_opt_in_the_same_tokens(tiny):
    """Another architecture (a random tiny Llama): its own forward in the loop (``train.generation: fast``), the
    very ids HF generate returns, with padding and the trainer's warpers."""
    from transformers import LlamaConfig, LlamaForCausalLM

    _, tokenizer = tiny
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=128, pad_token_id=0, eos_token_id=2, bos_token_id=None,
    )  # fmt: skip
    model = LlamaForCausalLM(config).eval()
    config = settings(temperature=1.3, top_p=0.9, top_k=30, max_new_tokens=8)
    generator = fastgen.Generator(model, config, tokenizer)
    assert not generator.lean and "llama" in generator.why_not_lean
    ids, mask = prompts(tokenizer)
    for seed in range(3):
        torch.manual_seed(seed)
        with torch.no_grad():
            expected = model.generate(input_ids=ids, attention_mask=mask, generation_config=config)
        torch.manual_seed(seed)
        assert torch.equal(generator(ids, mask), expected)


def test_the_lean_forward_is_the_models_own_step_by_step(tiny):
    """Prefill then one token at a time: the lean forward's logits equal, bit for bit, those of the model's own
    forward with its cache, and their log-probs equal a plain forward's over the whole sequence (which sums in
    another order: to float32 rounding) on the same tokens."""
    model, tokenizer = tiny
    generator = fastgen.Generator(model, settings(max_new_tokens=8, eos_token_id=None), tokenizer)
    ids, mask = prompts(tokenizer)
    torch.manual_seed(0)
    full = generator(ids, mask)
    width = ids.shape[1]
    attention = torch.cat([mask, torch.ones(full.shape[0], full.shape[1] - width, dtype=mask.dtype)], dim=1)
    positions = (attention.cumsum(-1) - 1).masked_fill(attention == 0, 0)
    padding = None if bool(mask.all()) else mask
    lean_cache = model_cache = None
    lean_logps, model_logps = [], []
    with torch.no_grad():
        for t in range(width, full.shape[1]):
            new = full[:, :width] if t == width else full[:, t - 1 : t]
            step_mask = None if padding is None else attention[:, :t]
            lean, lean_cache = generator._lean_step(new, positions[:, :t], step_mask, lean_cache)
            own, model_cache = generator._model_step(new, positions[:, :t], step_mask, model_cache)
            assert torch.equal(lean, own)
            logp = torch.log_softmax(lean[:, -1].float(), -1)
            lean_logps.append(logp.gather(-1, full[:, t : t + 1]))
            model_logps.append(torch.log_softmax(own[:, -1].float(), -1).gather(-1, full[:, t : t + 1]))
        logits = model(input_ids=full, attention_mask=attention).logits[:, width - 1 : -1].float()
    plain = torch.log_softmax(logits, -1).gather(-1, full[:, width:, None]).squeeze(-1)
    torch.testing.assert_close(torch.cat(lean_logps, 1), plain, rtol=1e-5, atol=1e-5)
    assert torch.equal(torch.cat(lean_logps, 1), torch.cat(model_logps, 1))


def exact_distribution(logits, previous, temperature, top_k, top_p, min_p, penalty):
    """The sampling distribution of one step, computed here without transformers' processors: repetition
    penalty over ``previous`` ids, temperature, top-k, top-p (the smallest set of the most likely tokens whose
    mass reaches top_p), min-p (relative to the most likely token), in HF generate's order."""
    logits = logits.double().clone()
    for token in set(previous):
        logits[token] = logits[token] / penalty if logits[token] > 0 else logits[token] * penalty
    logits = logits / temperature
    keep = torch.ones_like(logits, dtype=torch.bool)
    if top_k:
        keep &= logits >= torch.topk(logits, top_k).values[-1]
    if top_p < 1:
        probs = torch.softmax(logits.masked_fill(~keep, -math.inf), -1)
        order = probs.argsort(descending=True)
        before = probs[order].cumsum(0) - probs[order]  # the mass of the tokens ahead of each
        nucleus = torch.zeros_like(keep)
        nucleus[order[before < top_p]] = True
        keep &= nucleus
    if min_p is not None:
        probs = torch.softmax(logits.masked_fill(~keep, -math.inf), -1)
        keep &= probs >= min_p * probs.max()
    return torch.softmax(logits.masked_fill(~keep, -math.inf), -1)


def chi_square_p(counts, probs, draws: int) -> float:
    """The p-value of Pearson's chi-square of ``counts`` against ``probs`` (cells of expectation under 5 pooled)."""
    from scipy.stats import chi2

    expected = probs * draws
    big = expected >= 5
    observed = torch.cat([counts[big].double(), counts[~big].double().sum().reshape(1)])
    expected = torch.cat([expected[big], expected[~big].sum().reshape(1)])
    if expected[-1] < 5:  # the pooled cell too small: into the smallest kept cell
        observed, expected = observed[:-1], expected[:-1]
        observed[-1] += counts[~big].sum()
        expected[-1] += probs[~big].sum() * draws
    stat = float(((observed - expected) ** 2 / expected).sum())
    assert int((counts[probs == 0]).sum()) == 0, "a token outside the support was drawn"
    return float(chi2.sf(stat, len(expected) - 1))


@pytest.mark.parametrize(
    "warp",
    [
        dict(temperature=1.0, top_k=0, top_p=1.0, min_p=None, repetition_penalty=1.0),
        dict(temperature=1.7, top_k=12, top_p=0.9, min_p=None, repetition_penalty=1.0),
        dict(temperature=1.4, top_k=0, top_p=1.0, min_p=0.05, repetition_penalty=1.5),
    ],
    ids=["plain", "temperature top-k top-p", "min-p repetition penalty"],
)
def test_first_and_second_tokens_follow_the_exact_softmax(tiny, warp):
    """4,000 completions of one prompt: the first token's frequencies, and the second's after the most frequent
    first token, against the exact probabilities of the warped logits (chi-square, p > 1e-4; a draw outside the
    support fails at once)."""
    model, tokenizer = tiny
    config = settings(max_new_tokens=2, eos_token_id=None, **warp)
    generator = fastgen.Generator(model, config, tokenizer)
    ids, mask = prompts(tokenizer, [(7, 55)], 1)
    draws = 4000
    torch.manual_seed(1234)
    out = generator(ids.expand(draws, -1), mask.expand(draws, -1))
    args = (warp["temperature"], warp["top_k"], warp["top_p"], warp["min_p"], warp["repetition_penalty"])
    with torch.no_grad():
        first_logits = model(input_ids=ids).logits[0, -1]
    first = out[:, ids.shape[1]]
    probs = exact_distribution(first_logits, ids[0].tolist(), *args)
    counts = torch.bincount(first, minlength=probs.numel())
    assert chi_square_p(counts, probs, draws) > 1e-4
    token = int(counts.argmax())
    rows = first == token
    prefix = torch.cat([ids[0], torch.tensor([token])])
    with torch.no_grad():
        second_logits = model(input_ids=prefix[None]).logits[0, -1]
    probs = exact_distribution(second_logits, prefix.tolist(), *args)
    counts = torch.bincount(out[rows, ids.shape[1] + 1], minlength=probs.numel())
    assert chi_square_p(counts, probs, int(rows.sum())) > 1e-4


def test_settings_it_does_not_reproduce_are_refused(tiny):
    model, tokenizer = tiny
    with pytest.raises(ValueError, match="no_repeat|NoRepeat"):
        fastgen.Generator(model, settings(no_repeat_ngram_size=2), tokenizer)
    with pytest.raises(ValueError, match="beam"):
        fastgen.Generator(model, settings(num_beams=2, do_sample=False), tokenizer)


@pytest.mark.parametrize(
    ("train", "resources", "kind", "expected"),
    [
        ({}, {}, "qwen2", "fast"),
        ({}, {}, "llama", "hf"),
        ({}, {}, None, "hf"),
        ({}, {"gpus_per_node": 1}, "qwen2", "hf"),
        ({"generation": "fast"}, {"gpus_per_node": 1}, "llama", "fast"),
        ({"generation": "hf"}, {}, "qwen2", "hf"),
        ({"use_vllm": True, "generation": "fast"}, {}, "qwen2", "vllm"),
        ({"sharding": "fsdp", "generation": "fast"}, {}, "qwen2", "hf"),
    ],
)
def test_generation_path(train, resources, kind, expected):
    path, why = fastgen.generation_path({"train": train, "model": {"resources": resources}}, kind)
    assert path == expected
    assert why


def test_plan_says_which_path_each_run_takes(tmp_path):
    """``klsweep plan``'s resources rows: the tiny study on the fast path; with train.generation hf, HF generate
    and why, in a note; decided without importing torch (tests/unit/test_module_boundaries.py: plan)."""
    from klsweep import grid, planner

    shipped = grid.shipped.grid_file("tiny")
    plan = grid.load_plan(shipped, out=tmp_path)
    rows = planner.summary(plan)["resources"]
    assert [(r["runs"], r["generation"]) for r in rows] == [(len(plan.runs), "fast")]
    counts = planner.summary(grid.load_plan(shipped, ["train.generation=hf"], out=tmp_path))
    assert [r["generation"] for r in counts["resources"]] == ["hf"]
    assert any("generate with hf: train.generation is hf" in note for note in counts["notes"])
