"""lm-eval's ``vllm`` backend through klsweep's eval path (``eval.backend: vllm``), on vLLM's CPU build
(``./dev.sh vllm-test``): a trained stand-in scores the same greedy answers as with the ``hf`` backend on the
same items, and eval.max_model_len / eval.gpu_memory_utilization reach vLLM's engine (on a CPU, its KV cache is what
the eval needs)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from klsweep import evaluate as ev
from klsweep.evaluate import running
from klsweep.tinymodel import TinySpec, tiny_model_path

pytestmark = pytest.mark.vllm

# the tiny study's model with head_dim 64 (vLLM's CPU attention refuses its 16), warm-started the same way:
# trained, so that its greedy answers are rarely near a tie between two tokens
HEAD_DIM_64 = TinySpec(hidden_size=128, num_attention_heads=2, num_key_value_heads=1)
LIMIT = 16  # questions per task


@pytest.fixture(scope="module")
def trained() -> Path:
    return tiny_model_path(spec=HEAD_DIM_64)


def _answers(results: Path) -> dict[tuple[str, int], str]:
    out = {}
    for path in sorted(results.parent.glob("samples_*.jsonl")):
        task = path.stem.removeprefix("samples_")
        for line in path.read_text().splitlines():
            row = json.loads(line)
            out[task, row["doc_id"]] = row["filtered_resps"][0]
    return out


def test_vllm_backend_gives_the_hf_backends_greedy_answers(tmp_path, trained, monkeypatch):
    from test_evaluate import make_run  # tests/integration is on sys.path under pytest

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)  # klsweep's rule, not the environment's
    run = make_run(tmp_path / "sweep", "trained", trained)
    built = []
    make_lm = running._make_lm
    monkeypatch.setattr(running, "_make_lm", lambda item, cfg: built.append(make_lm(item, cfg)) or built[-1])
    answers, scores = {}, {}
    for backend in ("hf", "vllm"):
        cfg = replace(ev.load_suite("tiny"), limit=LIMIT, backend=backend, max_model_len=200)
        cfg = replace(cfg, gpu_memory_utilization=0.5)
        (results,) = ev.eval_many([run], cfg)
        data = json.loads(results.read_text())
        assert data["backend"] == backend
        answers[backend] = _answers(results)
        scores[backend] = {**data["metrics"]["in_domain"], **data["metrics"]["ood"]}
    engine = built[-1].model.llm_engine.vllm_config  # the vllm backend's LLM, kept alive by this list
    assert engine.model_config.max_model_len == 200
    assert engine.cache_config.gpu_memory_utilization == 0.5
    # #44: on a CPU the KV cache its batch needs (16 x 200 tokens: the CPU build's least, 1 GiB), not
    # gpu_memory_utilization of the machine's memory (0.9 of it: more than a busy machine has free)
    assert engine.cache_config.kv_cache_memory_bytes == 2**30
    assert len(answers["hf"]) == 3 * LIMIT and answers["hf"].keys() == answers["vllm"].keys()
    differ = {
        k: (answers["hf"][k], answers["vllm"][k])
        for k in answers["hf"]
        if answers["hf"][k] != answers["vllm"][k]
    }
    assert not differ, differ  # the same greedy answer on every item
    assert scores["hf"] == scores["vllm"]
    assert max(scores["hf"].values()) > 0  # a trained model: answers, not noise


def test_gpu_check_vllm_colocate_step_at_tiny_size(tmp_path):
    """bench/gpu_check.sh's vLLM colocate step (gpu_check.py --vllm) at tiny size on vLLM's CPU build: every
    variant trains with generation by TRL's colocate vLLM, so the script the first lent GPU runs cannot rot."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    out = tmp_path / "gpu_check_vllm.json"
    cmd = [sys.executable, str(root / "bench" / "gpu_check.py"), "--vllm", "--sizes", "tiny", "--length", "8",
           "--steps", "1", "--prompts", "2", "--group", "4", "--out", str(out)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["generation"] == "vllm colocate"
    assert {r["variant"] for r in report["rows"]} == {"trl", "loss", "reward", "both"}
    assert all(r["step_s"] > 0 and r["changed_fraction"] > 0.9 for r in report["rows"])
