"""``train.numerics: fast`` against TRL's and HF's operations on the shipped tiny model (weights moved off their
trained values, so that nothing sits at a saturated softmax): klsweep.fastpass's per-token log-probs and
entropies equal TRL's forward with its fused LM head to float32 rounding, and so do the gradients of a loss of
them; fastgen with the prompt prefilled once per distinct prompt returns HF generate's greedy tokens and samples
the exact softmax of the first and second tokens (chi-square); the plan's choice without torch."""

from __future__ import annotations

import copy
import random

import pytest
from test_fastgen import chi_square_p, exact_distribution, prompts, settings  # tests/unit is on sys.path

from klsweep import fastgen

torch = pytest.importorskip("torch")

TOLERANCE = dict(rtol=0, atol=2e-5)  # log-probs of order 1-10: float32 rounding of different summations


@pytest.fixture(scope="module")
def moved():
    """The shipped tiny model, every weight moved by noise of 0.05 (seeded), and its tokenizer."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from klsweep.tinymodel import tiny_model_path

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path())
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    yield model, AutoTokenizer.from_pretrained(tiny_model_path())
    torch.set_num_threads(threads)


def grpo_batch(seed: int, groups: int = 4, group: int = 8, width: int = 12, keep: int = 6):
    """A GRPO batch as TRL lays it out: ``groups`` prompts left-padded to ``width``, each repeated for its
    ``group`` completions of at most ``keep`` tokens, right-padded, the rows shuffled."""
    rng = random.Random(seed)
    rows, masks = [], []
    for _ in range(groups):
        pad = rng.randint(0, 3)
        prompt = [0] * pad + [rng.randint(3, 299) for _ in range(width - pad)]
        prompt_mask = [0] * pad + [1] * (width - pad)
        for _ in range(group):
            end = rng.randint(1, keep)
            rows.append(prompt + [rng.randint(3, 299) for _ in range(end)] + [0] * (keep - end))
            masks.append(prompt_mask + [1] * end + [0] * (keep - end))
    order = list(range(len(rows)))
    rng.shuffle(order)
    return torch.tensor([rows[i] for i in order]), torch.tensor([masks[i] for i in order])


def trl_pass(model, ids, mask, keep: int, temperature: float):
    """TRL's log-probs and entropies: its fused LM head on the model's forward (GRPOTrainer's call)."""
    labels = ids.masked_fill(mask == 0, -100)
    labels[:, :-keep] = -100
    out = model(input_ids=ids, attention_mask=mask, labels=labels, fused_lm_head=True)
    return out.log_probs[:, -keep:], out.entropy[:, -keep:]


@pytest.fixture(scope="module")
def pair(moved):
    """Two copies of the moved model: TRL's fused LM head added to the first (as GRPOTrainer adds it)."""
    from trl.trainer.utils import add_fused_lm_head

    model, _ = moved
    trl, lean = copy.deepcopy(model), copy.deepcopy(model)
    add_fused_lm_head(trl, temperature=1.0, outputs=("log_probs", "entropy"))
    return trl, lean


@pytest.mark.parametrize(("keep", "temperature"), [(6, 1.0), (1, 1.0), (4, 0.7)])
def test_logps_entropies_and_gradients_are_trls_to_rounding(pair, keep, temperature):
    """The lean pass against TRL's on five shuffled GRPO batches: log-probs and entropies within 2e-5 (0 on
    padding, as TRL's), and the gradient of an advantage-weighted sum of the log-probs within 1e-4 of its
    largest element, for every parameter (finite everywhere: padded prompt rows attend to nothing)."""
    from trl.trainer.utils import add_fused_lm_head

    from klsweep import fastpass

    trl, lean = pair
    if temperature != 1.0:
        trl = copy.deepcopy(lean)
        add_fused_lm_head(trl, temperature=temperature, outputs=("log_probs", "entropy"))
    assert fastpass.unsupported(lean) is None
    for seed in range(5):
        ids, mask = grpo_batch(seed, keep=keep)
        advantages = torch.randn(ids.shape[0], 1, generator=torch.Generator().manual_seed(seed))
        trl.zero_grad()
        lean.zero_grad()
        expected, expected_entropy = trl_pass(trl, ids, mask, keep, temperature)
        got, entropy = fastpass.logps(lean, ids, mask, keep, temperature=temperature, entropy=True)
        torch.testing.assert_close(got, expected, **TOLERANCE)
        torch.testing.assert_close(entropy, expected_entropy, **TOLERANCE)
        assert bool((got[mask[:, -keep:] == 0] == 0).all())
        (expected * advantages).sum().backward()
        (got * advantages).sum().backward()
        for (name, p), q in zip(trl.named_parameters(), lean.parameters(), strict=True):
            assert torch.isfinite(q.grad).all(), name
            scale = p.grad.abs().max().item()
            torch.testing.assert_close(q.grad, p.grad, rtol=0, atol=1e-4 * scale + 1e-9, msg=name)
        with torch.no_grad():
            plain, none = fastpass.logps(lean, ids, mask, keep, temperature=temperature)
        assert none is None and torch.equal(plain, got.detach())


def test_the_pass_refuses_what_it_does_not_reproduce(moved):
    from transformers import LlamaConfig, LlamaForCausalLM

    from klsweep import fastpass

    config = LlamaConfig(
        vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2, pad_token_id=0,
    )  # fmt: skip
    assert "llama" in fastpass.unsupported(LlamaForCausalLM(config))
    model = copy.deepcopy(moved[0])
    model.config.final_logit_softcapping = 30.0
    assert "final_logit_softcapping" in fastpass.unsupported(model)


def test_shared_prompts_greedy_tokens_are_hf_generates(moved):
    """Greedy (argmax) decoding with each distinct prompt prefilled once: HF generate's tokens, padded batches
    of repeated prompts (a GRPO batch) and of distinct ones."""
    model, tokenizer = moved
    config = settings(do_sample=False, max_new_tokens=8, eos_token_id=None)
    generator = fastgen.Generator(model, config, tokenizer, share_prompts=True)
    assert generator.share_prompts
    for ids, mask in (prompts(tokenizer), prompts(tokenizer, [(11, 22), (33, 44), (5, 6)], 1)):
        with torch.no_grad():
            expected = model.generate(input_ids=ids, attention_mask=mask, generation_config=config)
        assert torch.equal(generator(ids, mask), expected)


@pytest.mark.parametrize(
    "warp",
    [
        dict(temperature=1.0, top_k=0, top_p=1.0, min_p=None, repetition_penalty=1.0),
        dict(temperature=1.7, top_k=12, top_p=0.9, min_p=None, repetition_penalty=1.0),
    ],
    ids=["plain", "temperature top-k top-p"],
)
def test_shared_prompts_sample_the_exact_softmax(moved, warp):
    """4,000 completions of two prompts in one batch (left-padded), each prompt prefilled once: each prompt's
    first token, and its second after its most frequent first token but the end tokens, follow the exact probabilities of the
    warped logits (chi-square, p > 1e-4; a draw outside the support fails at once)."""
    model, tokenizer = moved
    config = settings(max_new_tokens=2, eos_token_id=None, **warp)
    generator = fastgen.Generator(model, config, tokenizer, share_prompts=True)
    ids, mask = prompts(tokenizer, [(7, 55), (120, 3)], 2000)
    torch.manual_seed(4321)
    out = generator(ids, mask)
    args = (warp["temperature"], warp["top_k"], warp["top_p"], warp["min_p"], warp["repetition_penalty"])
    width = ids.shape[1]
    for rows in (slice(0, 2000), slice(2000, 4000)):
        prompt = ids[rows.start][mask[rows.start] == 1]
        with torch.no_grad():
            first_logits = model(input_ids=prompt[None]).logits[0, -1]
        first = out[rows, width]
        probs = exact_distribution(first_logits, prompt.tolist(), *args)
        counts = torch.bincount(first, minlength=probs.numel())
        assert chi_square_p(counts, probs, 2000) > 1e-4
        token = int(counts.index_fill(0, torch.tensor([0, 2]), 0).argmax())  # not an end: no second draw
        chosen = first == token
        prefix = torch.cat([prompt, torch.tensor([token])])
        with torch.no_grad():
            second_logits = model(input_ids=prefix[None]).logits[0, -1]
        probs = exact_distribution(second_logits, prefix.tolist(), *args)
        counts = torch.bincount(out[rows][chosen, width + 1], minlength=probs.numel())
        assert chi_square_p(counts, probs, int(chosen.sum())) > 1e-4


@pytest.mark.parametrize(
    ("train", "resources", "kind", "expected"),
    [
        ({}, {}, "qwen2", "exact"),
        ({"numerics": "fast"}, {}, "qwen2", "fast"),
        ({"numerics": "fast"}, {}, "llama", "exact"),
        ({"numerics": "fast"}, {}, None, "exact"),
        ({"numerics": "fast"}, {"gpus_per_node": 1}, "qwen2", "exact"),
        ({"numerics": "fast", "use_vllm": True}, {}, "qwen2", "exact"),
        ({"numerics": "fast", "sharding": "fsdp"}, {}, "qwen2", "exact"),
        ({"numerics": "fast"}, {"tasks_per_node": 2}, "qwen2", "exact"),
    ],
)
def test_numerics_path(train, resources, kind, expected):
    path, why = fastgen.numerics_path({"train": train, "model": {"resources": resources}}, kind)
    assert path == expected
    assert why


def test_plan_says_which_runs_compute_fast_and_their_ids_differ(tmp_path):
    """``klsweep plan`` of the tiny study (fast numerics since study v6): with train.numerics exact every run
    computes exact under another id (runs of both never share one); decided without torch
    (tests/unit/test_module_boundaries.py: plan)."""
    from klsweep import grid, planner

    shipped = grid.shipped.grid_file("tiny")
    fast = grid.load_plan(shipped, out=tmp_path)
    rows = planner.summary(fast)["resources"]
    assert [(r["runs"], r["numerics"]) for r in rows] == [(len(fast.runs), "fast")]
    exact = grid.load_plan(shipped, ["train.numerics=exact"], out=tmp_path)
    assert [(r["runs"], r["numerics"]) for r in planner.summary(exact)["resources"]] == [
        (len(fast.runs), "exact")
    ]
    assert not {r.id for r in exact.runs} & {r.id for r in fast.runs}
    assert len({r.id for r in fast.runs}) == len(fast.runs)
