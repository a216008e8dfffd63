"""Issue 48's study ratio: ``klsweep study`` of study v5's grid on fast numerics over the same study on exact
numerics, today's code, CPU time (this process's children: the study, its supervisor, workers and eval jobs).

    .venv/bin/python bench/bench_study_ratio.py                    # the whole v5 grid, both ways: ~50 min CPU
    .venv/bin/python bench/bench_study_ratio.py --seeds 2 --reps 2 # 20 runs a study, interleaved: ~25 min CPU

Study v5's grid is sweeps/tiny.yaml as of commit 4b78a56 (``git show``); ``--seeds K`` keeps the first K seeds
of each arm (its runs are the full study's, by run id; its verdicts are not). Each repetition runs both studies,
the order alternating, each in a fresh results folder; CPU seconds are the children's user + system time
(``resource.getrusage``), wall seconds as measured. A study's fixed costs (the baseline's eval, the report, the
start) weigh more in a subset than in the whole grid, so a subset's ratio is an upper bound of the whole's.
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_outside import v5_grid  # noqa: E402

KLSWEEP = Path(sys.executable).with_name("klsweep")


def subset(grid: Path, seeds: int | None) -> Path:
    """The grid with each arm's ``seed: range(n)`` cut to ``range(min(n, seeds))``."""
    if not seeds:
        return grid
    text = re.sub(
        r"seed: range\((\d+)\)", lambda m: f"seed: range({min(int(m[1]), seeds)})", grid.read_text()
    )
    grid.write_text(text)
    return grid


def study(grid: Path, numerics: str, out: Path) -> tuple[float, float, int]:
    """Wall and CPU seconds of one ``klsweep study`` (its children included), and its exit code."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(
        [str(KLSWEEP), "study", str(grid), f"train.numerics={numerics}", "--out", str(out)],
        capture_output=True,
        text=True,
        env={**os.environ, "WANDB_SILENT": "true"},
    )
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if done.returncode not in (0, 1):
        print(done.stdout[-2000:], done.stderr[-3000:], file=sys.stderr)
    return wall, cpu, done.returncode


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=None, help="the first K seeds of each arm (default: all)")
    ap.add_argument("--reps", type=int, default=1)
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="klsweep-bench-ratio-"))
    grid = subset(v5_grid(root), args.seeds)
    times: dict[str, list[tuple[float, float]]] = {"exact": [], "fast": []}
    loads = [os.getloadavg()[0]]
    for rep in range(args.reps):
        for numerics in ("exact", "fast") if rep % 2 == 0 else ("fast", "exact"):
            wall, cpu, code = study(grid, numerics, root / f"{numerics}-{rep}")
            times[numerics].append((wall, cpu))
            loads.append(os.getloadavg()[0])
            print(f"rep {rep} {numerics}: {wall:.0f} s wall, {cpu:.0f} s CPU, exit {code}", file=sys.stderr)
    print(f"study v5 ({'all seeds' if not args.seeds else f'{args.seeds} seeds an arm'}), {args.reps} reps")
    print(f"load average at start and after each study: {', '.join(f'{x:.1f}' for x in loads)}")
    for numerics, rows in times.items():
        print(
            f"{numerics:<6} wall s: {', '.join(f'{w:.0f}' for w, _ in rows)}; CPU s: {', '.join(f'{c:.0f}' for _, c in rows)}"
        )
    for k, what in ((1, "CPU"), (0, "wall")):
        ratio = statistics.median(r[k] for r in times["fast"]) / statistics.median(
            r[k] for r in times["exact"]
        )
        print(f"fast / exact, {what}: {ratio:.3f} (target 0.6: {'met' if ratio <= 0.6 else 'MISSED'})")
    print(f"results left in {root}")


if __name__ == "__main__":
    main()
