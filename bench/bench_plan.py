"""Time planning a 10,000-run grid (goal: < 2 s) against a naive baseline measured in the same run: one Hydra
compose per run (timed on a sample and extrapolated). Then `klsweep plan` as a user meets it, whole processes
against `python -c "import klsweep.cli"` timed in the same run (issue 43's targets: the paper's sweep, nothing
cached, within 7x; the tiny grid within 5x; a 100,800-run grid in 10 s on 2 cores), wall and CPU time.

    .venv/bin/python bench/bench_plan.py [--processes-only] [--rounds 3]
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


def processes(rounds: int = 3) -> None:
    """`klsweep plan` of the paper's sweep (offline, nothing cached: a fresh HF_HOME; and with
    cluster.offline=false, where no cache is checked), of the tiny grid and of a 100,800-run grid, each a whole
    process, interleaved ``rounds`` times with the baseline
    `python -c "import klsweep.cli"`; the fastest of each, as wall time and as CPU time (the machine's load
    moves the first, less the second). klsweep's modules compiled first, as an installed package has them
    (PYTHONDONTWRITEBYTECODE would otherwise compile them in every process); composed configs cached by a
    first, untimed plan of each grid (a plan keeps them, ``grid.compose``)."""
    import compileall
    import os
    import subprocess
    import sys

    import klsweep

    compileall.compile_dir(Path(klsweep.__file__).parent, quiet=1)
    with tempfile.TemporaryDirectory() as d:
        big = Path(d) / "big.yaml"
        big.write_text(GRID.replace("range(28)", "range(280)"))  # 100,800 runs
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONDONTWRITEBYTECODE", "HF_HUB_OFFLINE")}
        env |= {"HF_HOME": str(Path(d) / "hf"), "COLUMNS": "80"}  # nothing cached
        plan = [sys.executable, "-m", "klsweep", "plan"]
        commands = {
            "baseline": [sys.executable, "-c", "import klsweep.cli"],
            "paper": [*plan, "paper", "--out", d],
            "paper cluster.offline=false": [*plan, "paper", "cluster.offline=false", "--out", d],
            "tiny": [*plan, "tiny", "--out", d],
            "100,800 runs": [*plan, str(big), "--max-runs", "200000", "--out", d],
        }
        for name in list(commands)[1:]:  # compose caches filled, as after a first plan
            subprocess.run(commands[name], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wall, cpu, codes = interleaved(commands, env, rounds)
    base_wall, base_cpu = min(wall["baseline"]), min(cpu["baseline"])
    print(f'baseline `python -c "import klsweep.cli"`: {base_wall:.2f} s wall, {base_cpu:.2f} s CPU')
    for name, target in (("paper", 7.0), ("paper cluster.offline=false", 7.0), ("tiny", 5.0)):
        w, c = min(wall[name]), min(cpu[name])
        met = "met" if w <= target * base_wall else "MISSED"
        print(
            f"`klsweep plan {name}` (exit {codes[name]}): {w:.2f} s wall, {w / base_wall:.1f}x (target "
            f"{target:g}x: {met}); {c:.2f} s CPU, {c / base_cpu:.1f}x"
        )
    w, c = min(wall["100,800 runs"]), min(cpu["100,800 runs"])
    print(
        f"`klsweep plan` of a 100,800-run grid: {w:.2f} s wall (target 10 s on 2 cores: "
        f"{'met' if w <= 10 else 'MISSED'}), {c:.2f} s CPU"
    )


def interleaved(
    commands: dict[str, list[str]], env: dict[str, str], rounds: int
) -> tuple[dict[str, list[float]], dict[str, list[float]], dict[str, int]]:
    """Each command run ``rounds`` times, interleaved: their wall and CPU times, and exit codes; the load average
    printed before and after."""
    import os

    print(f"load average before: {' '.join(f'{x:.1f}' for x in os.getloadavg())} ({os.cpu_count()} CPUs)")
    wall: dict[str, list[float]] = {name: [] for name in commands}
    cpu: dict[str, list[float]] = {name: [] for name in commands}
    codes: dict[str, int] = {}
    for _ in range(rounds):
        for name, cmd in commands.items():
            wall_s, cpu_s, codes[name] = _timed(cmd, env)
            wall[name].append(wall_s)
            cpu[name].append(cpu_s)
    print(f"load average after: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    return wall, cpu, codes


def _timed(cmd: list[str], env: dict[str, str]) -> tuple[float, float, int]:
    """A process's wall time, its CPU time (user + system) and its exit code."""
    import os
    import subprocess

    t = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t
    proc.returncode = os.waitstatus_to_exitcode(status)
    return wall, usage.ru_utime + usage.ru_stime, proc.returncode


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--processes-only", action="store_true", help="only the `klsweep plan` processes")
    parser.add_argument(
        "--rounds", type=int, default=3, help="times each process is timed (the fastest counts)"
    )
    args = parser.parse_args()
    if not args.processes_only:
        main()
    processes(args.rounds)
