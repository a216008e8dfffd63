"""Issue 48's study ratio: ``klsweep study`` of study v5's grid on fast numerics over the same study as the code
stood when the issue was filed (``pinned``: commit 5940541, exact numerics, the only ones it had) and over
today's code on exact numerics (``exact``), CPU time (this process's children: the study, its supervisor,
workers and eval jobs).

    .venv/bin/python bench/bench_study_ratio.py                    # the whole v5 grid, three ways: ~75 min CPU
    .venv/bin/python bench/bench_study_ratio.py --arms pinned,fast # the issue's ratio alone
    .venv/bin/python bench/bench_study_ratio.py --seeds 2 --reps 2 # 20 runs a study, interleaved

Study v5's grid is sweeps/tiny.yaml as of commit 4b78a56 (``git show``; the same grid as at 5940541, a comment
apart). The pinned code is ``git archive`` of its commit, run by this interpreter with that tree first on
``PYTHONPATH`` (the local back end's workers and eval jobs inherit it): the same dependencies, only klsweep's
code differs (its lock added playwright since, a test extra). ``--seeds K`` keeps the first K seeds
of each arm (its runs are the full study's, by run id; its verdicts are not). Each repetition runs both studies,
the order alternating, each in a fresh results folder. CPU seconds are the whole process tree's: a cgroup's
``cpuacct.usage`` (v1) or ``cpu.stat`` (v2) where this user may make one (root on most VMs), which counts
processes that leave their parent too (the pinned code's local supervisor does); else the machine's busy time
from ``/proc/stat``, true on an otherwise idle machine only (the bench says which it used). Wall seconds as
measured. A study's fixed costs (the baseline's eval, the report, the
start) weigh more in a subset than in the whole grid, so a subset's ratio is an upper bound of the whole's.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_outside import v5_grid  # noqa: E402

KLSWEEP = Path(sys.executable).with_name("klsweep")
ROOT = Path(__file__).resolve().parents[1]
PINNED = "5940541"  # main when issue 48 was filed (the commit before its first, a1511f2)


def subset(grid: Path, seeds: int | None) -> Path:
    """The grid with each arm's ``seed: range(n)`` cut to ``range(min(n, seeds))``."""
    if not seeds:
        return grid
    text = re.sub(
        r"seed: range\((\d+)\)", lambda m: f"seed: range({min(int(m[1]), seeds)})", grid.read_text()
    )
    grid.write_text(text)
    return grid


def pinned_tree(folder: Path, commit: str) -> Path:
    """klsweep's tree at ``commit`` (``git archive``), unpacked into ``folder``."""
    folder.mkdir()
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", commit, "klsweep"], capture_output=True, check=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(folder)], input=archive, check=True)
    return folder


CGROUPS = (  # (the controller's folder, the file of its CPU use, nanoseconds per unit, the line's key)
    (Path("/sys/fs/cgroup/cpuacct"), "cpuacct.usage", 1, None),
    (Path("/sys/fs/cgroup"), "cpu.stat", 1000, "usage_usec"),
)


class TreeCPU:
    """CPU seconds of a process and every process it starts, in a cgroup of its own where one can be made."""

    def __init__(self, name: str) -> None:
        self.group: Path | None = None
        for folder, file, scale, key in CGROUPS:
            if (folder / "cgroup.procs").exists() and os.access(folder, os.W_OK):
                group = folder / name
                try:
                    group.mkdir()
                except OSError:
                    continue
                self.group, self.file, self.scale, self.key = group, file, scale, key
                break
        self.what = "cgroup" if self.group else "machine busy time (/proc/stat)"

    def enter(self) -> None:
        """In the child before it runs: join the cgroup."""
        if self.group is not None:
            (self.group / "cgroup.procs").write_text(str(os.getpid()))

    def read(self) -> float:
        if self.group is None:
            fields = [int(x) for x in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
            busy = sum(fields) - fields[3] - fields[4]  # all but idle and iowait
            return busy / os.sysconf("SC_CLK_TCK")
        text = (self.group / self.file).read_text()
        if self.key is None:
            return int(text) / 1e9
        return next(int(line.split()[1]) for line in text.splitlines() if line.startswith(self.key)) * (
            self.scale / 1e9
        )

    def close(self) -> None:
        if self.group is not None:
            with contextlib.suppress(OSError):
                self.group.rmdir()


def study(grid: Path, arm: str, out: Path, pinned: Path) -> tuple[float, float, int, str]:
    """Wall and CPU seconds of one ``klsweep study`` (its whole process tree), its exit code and how its CPU
    was measured."""
    env = {**os.environ, "WANDB_SILENT": "true"}
    if arm == "pinned":
        command = [sys.executable, "-m", "klsweep", "study", str(grid), "--out", str(out)]
        env["PYTHONPATH"] = os.pathsep.join([str(pinned), *filter(None, [env.get("PYTHONPATH")])])
    else:
        command = [str(KLSWEEP), "study", str(grid), f"train.numerics={arm}", "--out", str(out)]
    tree = TreeCPU(f"klsweep-bench-{os.getpid()}-{out.name}")
    before = tree.read()
    start = time.perf_counter()
    # cwd outside the checkout: ``python -m`` puts the working folder first on sys.path, and so does submitit's
    # ``python -m submitit.core._submit`` for each job: from the checkout, today's klsweep would run as "pinned"
    done = subprocess.run(
        command, capture_output=True, text=True, env=env, preexec_fn=tree.enter, cwd=out.parent
    )
    wall = time.perf_counter() - start
    time.sleep(1)  # what the study left running (a supervisor's last poll) ends
    cpu = tree.read() - before
    tree.close()
    if done.returncode not in (0, 1):
        print(done.stdout[-2000:], done.stderr[-3000:], file=sys.stderr)
    if arm == "pinned":
        check_pinned(out)
    return wall, cpu, done.returncode, tree.what


def check_pinned(out: Path) -> None:
    """The pinned study's files are the pinned code's: no run's config.yaml has ``train.numerics`` and no
    results.json has ``cpu_threads`` (both came after 5940541), or the bench stops."""
    configs = list(out.glob("*/*/config.yaml"))
    results = list(out.glob("*/*/eval/*/*/results.json")) + list(
        out.glob("*/baseline/*/eval/*/*/results.json")
    )
    newer = [c for c in configs if "numerics:" in c.read_text()]
    newer += [r for r in results if '"cpu_threads"' in r.read_text()]
    if not configs or not results or newer:
        sys.exit(
            f"the pinned study did not run the pinned code: {len(configs)} configs, {len(results)} evals, "
            f"{len(newer)} written by newer code ({', '.join(map(str, newer[:3]))})"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=None, help="the first K seeds of each arm (default: all)")
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument(
        "--arms",
        default="pinned,exact,fast",
        help="which studies, comma-separated: pinned (the code at --pinned), exact, fast (today's code)",
    )
    ap.add_argument("--pinned", default=PINNED, help=f"the baseline's commit (default {PINNED})")
    args = ap.parse_args()
    arms = args.arms.split(",")
    if not set(arms) <= {"pinned", "exact", "fast"} or "fast" not in arms or len(arms) < 2:
        ap.error(f"--arms: fast and one or both of pinned, exact (got {args.arms!r})")
    root = Path(tempfile.mkdtemp(prefix="klsweep-bench-ratio-"))
    grid = subset(v5_grid(root), args.seeds)
    pinned = pinned_tree(root / "pinned-src", args.pinned) if "pinned" in arms else root
    times: dict[str, list[tuple[float, float]]] = {arm: [] for arm in arms}
    loads = [os.getloadavg()[0]]
    for rep in range(args.reps):
        for arm in arms if rep % 2 == 0 else arms[::-1]:
            wall, cpu, code, how = study(grid, arm, root / f"{arm}-{rep}", pinned)
            times[arm].append((wall, cpu))
            loads.append(os.getloadavg()[0])
            print(
                f"rep {rep} {arm}: {wall:.0f} s wall, {cpu:.0f} s CPU ({how}), exit {code}",
                file=sys.stderr,
                flush=True,
            )
    print(f"study v5 ({'all seeds' if not args.seeds else f'{args.seeds} seeds an arm'}), {args.reps} reps")
    print(f"load average at start and after each study: {', '.join(f'{x:.1f}' for x in loads)}")
    for arm, rows in times.items():
        print(
            f"{arm:<6} wall s: {', '.join(f'{w:.0f}' for w, _ in rows)}; CPU s: {', '.join(f'{c:.0f}' for _, c in rows)}"
        )
    for base in (a for a in arms if a != "fast"):
        for k, what in ((1, "CPU"), (0, "wall")):
            ratio = statistics.median(r[k] for r in times["fast"]) / statistics.median(
                r[k] for r in times[base]
            )
            target = f" (target 0.6: {'met' if ratio <= 0.6 else 'MISSED'})" if base == "pinned" else ""
            print(f"fast / {base}, {what}: {ratio:.3f}{target}")
    print(f"results left in {root}")


if __name__ == "__main__":
    main()
