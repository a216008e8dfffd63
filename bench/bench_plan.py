"""Time planning a 10,000-run grid (goal: < 2 s) against a naive baseline measured in the same run: one Hydra
compose per run (timed on a sample and extrapolated).

    .venv/bin/python bench/bench_plan.py
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

GRID = """\
name: bench
grid:
  kl.estimator: k1,k2,k3
  kl.placement: reward,loss,both
  kl.level: token,sequence
  kl.beta: 0.01,0.05,0.1,0.3,1.0
  offpolicy.lag: 0,2,4,10
  seed: range(28)
"""  # 3 * 3 * 2 * 5 * 4 * 28 = 10,080 runs


def main() -> None:
    from klsweep import grid

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "bench.yaml"
        path.write_text(GRID)
        grid.load_plan(path)  # warm up imports
        t = time.perf_counter()
        plan = grid.load_plan(path)
        planned = time.perf_counter() - t
    n = len(plan.runs)

    from hydra import compose, initialize_config_dir
    from hydra.core.config_store import ConfigStore
    from omegaconf import OmegaConf

    from klsweep.config import RunConfig

    ConfigStore.instance().store(name="klsweep_schema", node=RunConfig)
    sample = plan.runs[:50]
    t = time.perf_counter()
    with initialize_config_dir(config_dir=str(grid.CONF_DIR), version_base="1.3"):
        for run in sample:
            overrides = [f"{k}={v}" for k, v in run.params.items()]
            cfg = OmegaConf.to_container(compose(config_name="config", overrides=overrides), resolve=True)
            grid.run_id(cfg)
    naive = (time.perf_counter() - t) / len(sample) * n

    print(f"planned {n} runs in {planned:.3f} s ({planned / n * 1e6:.1f} us/run); goal < 2 s")
    print(f"naive per-run Hydra compose (50 timed, extrapolated): {naive:.1f} s for {n} runs")
    print(f"speed-up: {naive / planned:.0f}x")
    scaling(planned, n)


def scaling(planned: float, n: int) -> None:
    """A 10x larger grid (near the default run limit) against the one above: time should grow linearly and
    memory stay small (unchanged sections are shared between runs); a 2,000,000-run grid is refused before
    expansion."""
    import resource

    from klsweep import grid

    big = GRID.replace("range(28)", "range(280)")  # 100,800 runs
    huge = GRID.replace("range(28)", "range(5600)")  # 2,016,000 runs
    with tempfile.TemporaryDirectory() as d:
        path, refused = Path(d) / "big.yaml", Path(d) / "huge.yaml"
        path.write_text(big)
        refused.write_text(huge)
        t = time.perf_counter()
        plan = grid.load_plan(path, max_runs=200_000)
        seconds = time.perf_counter() - t
        t = time.perf_counter()
        try:
            grid.load_plan(refused)
        except grid.UserError:
            refusal = time.perf_counter() - t
    m = len(plan.runs)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e3  # kB on Linux
    print(
        f"planned {m} runs in {seconds:.2f} s: {seconds / m / (planned / n):.1f}x the time per run of the "
        f"{n}-run grid (1x: linear); this process's peak memory: {peak:.0f} MB"
    )
    print(f"refused a 2,016,000-run grid in {refusal:.2f} s ({refusal / planned:.2f}x the {n}-run plan)")


if __name__ == "__main__":
    main()
