"""Benchmark of ``klsweep report``: builds the report of a synthetic 1,000-run sweep and times it.

    python bench/bench_report.py [--runs 1000] [--steps 100] [--problems 500] [--formats md,csv,latex,html]
                                 [--keep DIR] [--claims]

The sweep (written to a temporary folder, or DIR with --keep) is 2 models x 3 estimators x 3 placements x 2 lags x
5 betas = 180 configurations, seeds filling up to --runs; states as in a sweep under way (mostly done, some
running, pending, failed, diverged); per run ~100 metrics rows, eval results of two checkpoints for the finished
runs (the final one's per-problem outcomes: ``samples_<task>.jsonl`` of --problems MATH-500 problems and a fifth
as many per OOD task), and a step-0 baseline per model. Prints the time of ``build_report`` (first call, with the imports of
pandas, matplotlib and scipy, no config cache and every figure drawn; and a second, warm call, whose configs
come from the report's cache and whose figures are unchanged and not redrawn), with the CPU of its forked children
(the figures, the configs not cached) and the wall time that CPU needs at the least on this machine's cores,
and of ``klsweep status`` over
the same sweep, each as a ratio to the baseline measured in the same run: the time just to read every file of
the sweep (json, and yaml's C loader for config.yaml); then the same as whole processes (the default
``klsweep report``: since issue 43, what ``klsweep study`` writes: report.md, report.html, the CSV files and
tables.json, the LaTeX tables, the PNG figures and their PDF copies; against a Python process that reads every
file). ``--claims``: the report also tests sweeps/tiny.yaml's claims at the bench's lag (10): their
replication resamples (``claims.replication``) in its time. Targets (on a quiet 2-core machine): the report within 1.5x of the baseline and < 2 s at 1,000 runs;
status < 1 s; as processes, the cold default report within 2x of the reading process, the warm one 1.5x.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import tempfile
import time
from dataclasses import asdict
from itertools import product
from pathlib import Path

import yaml

from klsweep.config import RunConfig
from klsweep.environment import usable_cores

ID, OOD = ["math500"], ["mmlu_college_physics", "mmlu_college_chemistry", "mmlu_college_biology"]
HASH = "bench0hash"


def _results(checkpoint: str, step: int, rng: random.Random) -> dict:
    return {
        "suite": "math",
        "eval_hash": HASH,
        "checkpoint": checkpoint,
        "step": step,
        "backend": "vllm",
        "metric": "exact_match",
        "metrics": {"in_domain": {t: rng.random() for t in ID}, "ood": {t: rng.random() for t in OOD}},
        "stderr": dict.fromkeys(ID + OOD, 0.01),
        "settings": {"num_fewshot": 0},
        "lm_eval_version": "0.4.13",
        "created_at": 1.7e9 + step,
    }


def _samples(task: str, problems: int, accuracy: float, rng: random.Random) -> tuple[str, float]:
    """A task's ``samples_<task>.jsonl`` as lm-eval writes it (one record per problem: the problem, the
    prompt, the response, the hashes, the score; short texts) and its accuracy."""
    scores = [float(rng.random() < accuracy) for _ in range(problems)]
    text = "Let x be the number of ways to choose the answer; compute x. " * 2
    rows = [
        json.dumps(
            {
                "doc_id": i,
                "doc": {"problem": text, "answer": "42"},
                "target": "42",
                "arguments": {"gen_args_0": {"arg_0": text, "arg_1": {"max_gen_toks": 1024}}},
                "resps": [[text + " The answer is 42."]],
                "filtered_resps": ["42"],
                "filter": "none",
                "metrics": ["exact_match"],
                "doc_hash": f"{i:064x}",
                "prompt_hash": f"{i:064x}",
                "target_hash": f"{i:064x}",
                "exact_match": score,
            }
        )
        for i, score in enumerate(scores)
    ]
    return "\n".join(rows) + "\n", sum(scores) / problems


def make_sweep(root: Path, runs: int = 1000, steps: int = 100, seed: int = 0, problems: int = 500) -> Path:
    """Write a synthetic sweep of ``runs`` run folders under ``root/bench``; returns the sweep folder. The final
    checkpoint of each finished run has its per-problem outcomes: ``problems`` of the in-domain task, a fifth as
    many of each OOD task (0: none, as runs evaluated before the samples were written)."""
    rng = random.Random(seed)
    sweep = root / "bench"
    grid = list(
        product(
            ["qwen-7b", "llama-8b"],
            ["k1", "k2", "k3"],
            ["reward", "loss", "both"],
            [0, 10],
            [0.0, 0.05, 0.1, 0.3, 1.0],
        )
    )
    for i in range(runs):
        model, est, plc, lag, beta = grid[i % len(grid)]
        c = asdict(RunConfig())
        c["name"], c["seed"] = "bench", i // len(grid)
        c["model"] |= {"name": model, "path": f"org/{model}"}
        c["kl"] |= {"estimator": est, "placement": plc, "beta": beta}
        c["offpolicy"]["lag"] = lag
        c["train"]["steps"] = steps
        d = sweep / f"run{i:04d}"
        d.mkdir(parents=True)
        (d / "config.yaml").write_text(yaml.safe_dump(c, sort_keys=False))
        u = rng.random()
        state = (
            "done"
            if u < 0.8
            else "running"
            if u < 0.88
            else "pending"
            if u < 0.93
            else "failed"
            if u < 0.97
            else "diverged"
        )
        if state == "pending":
            continue
        n = steps if state == "done" else rng.randrange(5, steps)
        peak = rng.uniform(0.3, 0.9)
        lines = []
        for s in range(1, n + 1):
            r = peak * min(1.0, s / 40) + rng.gauss(0, 0.03)
            lines.append(
                json.dumps(
                    {
                        "step": s,
                        "time": 1.7e9 + s,
                        "elapsed_s": 2.0 * s,
                        "reward_mean": r,
                        "reward_std": 0.2,
                        "kl_k1": 0.001 * s + rng.gauss(0, 0.002),
                        "kl_k3": 0.0005 * s,
                        "entropy": 1.5 * math.exp(-s / 200),
                        "completion_length": 300.0,
                        "clip_ratio": 0.01,
                        "grad_norm": 0.5,
                        "learning_rate": 1e-6,
                        "step_time": 2.0,
                        "loss": 0.01,
                        "kl_penalty": 0.0005 * s,
                    }
                )
            )
        (d / "metrics.jsonl").write_text("\n".join(lines) + "\n")
        status = {
            "state": state,
            "step": n,
            "total_steps": steps,
            "reason": None,
            "started_at": 1.7e9,
            "updated_at": 1.7e9 + n,
            "finished_at": None,
            "elapsed_s": 2.0 * n,
            "diverged_step": None,
            "error": None,
        }
        if state == "diverged":
            status |= {"diverged_step": n, "reason": "non-finite loss"}
        if state == "failed":
            status["error"] = "Traceback ...\nRuntimeError: out of memory"
        (d / "status.json").write_text(json.dumps(status))
        if state == "done":
            for step in (steps // 2, steps):
                p = d / "eval" / HASH / f"checkpoint-{step}" / "results.json"
                p.parent.mkdir(parents=True)
                res = _results(f"checkpoint-{step}", step, rng)
                for kind, tasks in (("in_domain", ID), ("ood", OOD)):
                    for t in tasks if step == steps and problems else ():
                        n = problems if kind == "in_domain" else max(1, problems // 5)
                        text, res["metrics"][kind][t] = _samples(t, n, res["metrics"][kind][t], rng)
                        (p.parent / f"samples_{t}.jsonl").write_text(text)
                p.write_text(json.dumps(res))
    for model in ("qwen-7b", "llama-8b"):
        b = sweep / "baseline" / model
        c = asdict(RunConfig())
        c["model"] |= {"name": model, "path": f"org/{model}"}
        (b / "eval" / HASH / "step-0").mkdir(parents=True)
        (b / "config.yaml").write_text(yaml.safe_dump(c, sort_keys=False))
        (b / "eval" / HASH / "step-0" / "results.json").write_text(json.dumps(_results("step-0", 0, rng)))
    return sweep


def read_everything(sweep: Path) -> int:
    """The baseline: read and parse every file of the sweep, nothing else. Returns the number of files."""
    n = 0
    for p in sweep.rglob("*"):
        if p.suffix == ".json":
            json.loads(p.read_text())
        elif p.suffix == ".jsonl":
            [json.loads(line) for line in p.read_text().splitlines() if line]
        elif p.suffix == ".yaml":
            yaml.load(p.read_text(), Loader=yaml.CSafeLoader)
        else:
            continue
        n += 1
    return n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=1000)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--formats", default="md,csv,latex,html")
    ap.add_argument("--keep", type=Path, default=None, help="write the sweep here and keep it")
    ap.add_argument(
        "--problems", type=int, default=500, help="per-problem outcomes of each scored run (0: none)"
    )
    ap.add_argument("--claims", action="store_true", help="test sweeps/tiny.yaml's claims (at lag 10)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = args.keep or Path(tmp)
        t = time.perf_counter()
        sweep = make_sweep(root, args.runs, args.steps, problems=args.problems)
        claims = write_claims(root) if args.claims else None
        print(f"wrote {args.runs} runs x {args.steps} steps in {time.perf_counter() - t:.1f} s: {sweep}")
        t, c = time.perf_counter(), time.process_time()
        files = read_everything(sweep)
        t_read, c_read = time.perf_counter() - t, time.process_time() - c
        print(f"baseline, read and parse every file ({files} files): {t_read:.2f} s wall, {c_read:.2f} s CPU")
        from klsweep.report import build_report
        from klsweep.submit import status

        t = time.perf_counter()
        rows = status(sweep)
        wall = time.perf_counter() - t
        print(
            f"status of {len(rows)} runs: {wall:.2f} s wall ({wall / t_read:.1f}x baseline); "
            f"target < 1 s: {'met' if wall < 1 else 'MISSED'}"
        )
        for call in ("first call (imports, no cache, every figure drawn)", "second call (warm)"):
            t, c, k = time.perf_counter(), time.process_time(), _children_cpu()
            report = build_report(sweep, root / "report", formats=args.formats.split(","), claims=claims)
            wall, cpu, kids = time.perf_counter() - t, time.process_time() - c, _children_cpu() - k
            print(
                f"build_report, {call}: {wall:.2f} s wall ({wall / t_read:.1f}x baseline), "
                f"{cpu:.2f} s CPU ({cpu / c_read:.1f}x baseline) and {kids:.2f} s in its forked children "
                f"(at least {(cpu + kids) / usable_cores():.2f} s of wall on {usable_cores()} cores); "
                f"target 1.5x: {'met' if wall < 1.5 * t_read else 'MISSED'}, "
                f"< 2 s: {'met' if wall < 2 else 'MISSED'}"
            )
        print(f"{len(report.main)} configurations, {len(report.paths)} files written to {report.out_dir}")
        processes(sweep, root, args.formats, claims)


def _children_cpu() -> float:
    """CPU seconds (user and system) of this process's children that have been waited for."""
    import resource

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def write_claims(root: Path) -> Path:
    """sweeps/tiny.yaml's claims at the bench's lag, 10 (its KL arms and beta 1 are in the bench's grid)."""
    text = (Path(__file__).parents[1] / "sweeps" / "tiny.yaml").read_text()
    path = root / "claims.yaml"
    path.write_text(text[text.index("claims:") :].replace("lag: 16", "lag: 10").replace("lag 16", "lag 10"))
    return path


def processes(sweep: Path, root: Path, formats: str, claims: Path | None = None) -> None:
    """The same as whole processes, as a user meets them: the default ``klsweep report`` (imports, the
    terminal tables, ``report.DEFAULT_FORMATS`` and the figures with their PDF copies) against a Python
    process that reads every file, each timed twice, interleaved; the report's first process writes a fresh folder (no cache, every figure drawn), its
    second finds them. ``formats``: unused (the in-process calls' formats), kept for the call's shape."""
    import shutil
    import subprocess
    import sys

    read = [
        sys.executable,
        "-c",
        f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); "
        f"import bench_report; bench_report.read_everything(__import__('pathlib').Path({str(sweep)!r}))",
    ]
    import compileall
    import os

    import klsweep

    # as an installed package is: its modules compiled once (an environment with PYTHONDONTWRITEBYTECODE set
    # would otherwise compile klsweep's sources in every report process, some 0.1 s the reading one never pays)
    compileall.compile_dir(Path(klsweep.__file__).parent, quiet=1)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    out = root / "report-process"
    shutil.rmtree(out, ignore_errors=True)
    report = [sys.executable, "-m", "klsweep", "report", str(sweep), "--out", str(out)]
    report += ["--claims", str(claims)] if claims is not None else []
    times: dict[str, list[float]] = {"read": [], "report": []}
    for _ in range(2):
        for name, cmd in (("read", read), ("report", report)):
            t = time.perf_counter()
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
            times[name].append(time.perf_counter() - t)
    base = min(times["read"])
    for call, wall, target in zip(
        ("first (cold: no cache, figures drawn)", "second (warm)"), times["report"], (2.0, 1.5), strict=True
    ):
        print(
            f"`klsweep report` process, {call}: {wall:.2f} s ({wall / base:.1f}x a process reading every "
            f"file, {base:.2f} s); target {target}x: {'met' if wall <= target * base else 'MISSED'}"
        )


if __name__ == "__main__":
    main()
