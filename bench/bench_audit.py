"""Time a second `klsweep audit --framework NAME --config FILE` of the same file as a user meets it, a whole
process against `python -c "import klsweep.cli"` timed in the same run (issue 50's target: within 5x, without
importing torch: the exact audit is kept on disk by configuration, klsweep/audit/cache.py), wall and CPU time,
the fastest of ``rounds`` interleaved rounds, as bench_plan.py times `klsweep plan`. The first audit of each file
(which computes the audit, importing torch) is untimed.

    .venv/bin/python bench/bench_audit.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import compileall
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from bench_plan import interleaved

FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "frameworks"
FILES = {  # a GRPO audit (NeMo-RL), an estimator audit (OpenRLHF's PPO script), a launch script (verl)
    "nemo-rl": FIXTURES / "corpus/nemo-rl/files/examples/configs/grpo_math_1B.yaml",
    "openrlhf": FIXTURES / "corpus/openrlhf/files/examples/scripts/train_ppo_ray_hybrid_engine.sh",
    "verl": FIXTURES / "corpus/verl/files/examples/grpo_trainer/run_qwen2-7b.sh",
}
TARGET = 5.0


def main(rounds: int) -> None:
    import klsweep

    compileall.compile_dir(Path(klsweep.__file__).parent, quiet=1)
    with tempfile.TemporaryDirectory() as d:
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        env |= {"KLSWEEP_CACHE": d, "COLUMNS": "80"}
        audit = [sys.executable, "-m", "klsweep", "audit", "--framework"]
        commands = {"baseline": [sys.executable, "-c", "import klsweep.cli"]}
        commands |= {name: [*audit, name, "--config", str(path)] for name, path in FILES.items()}
        for name in list(commands)[1:]:  # the first audit of each file: computed and kept
            subprocess.run(commands[name], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        torch_free = {
            name: subprocess.run(
                [sys.executable, "-c", _NO_TORCH, name, str(FILES[name])],
                env=env,
                capture_output=True,
                text=True,
            )
            .stdout.strip()
            .splitlines()[-1]
            for name in FILES
        }
        wall, cpu, codes = interleaved(commands, env, rounds)
    base_wall, base_cpu = min(wall["baseline"]), min(cpu["baseline"])
    print(f'baseline `python -c "import klsweep.cli"`: {base_wall:.2f} s wall, {base_cpu:.2f} s CPU')
    for name in FILES:
        w, c = min(wall[name]), min(cpu[name])
        met = "met" if w <= TARGET * base_wall else "MISSED"
        print(
            f"second `klsweep audit --framework {name}` (exit {codes[name]}, torch imported: {torch_free[name]}): "
            f"{w:.2f} s wall, {w / base_wall:.1f}x (target {TARGET:g}x: {met}); {c:.2f} s CPU, {c / base_cpu:.1f}x"
        )


# the CLI's work in a process that then says whether torch was imported
_NO_TORCH = """
import sys
from klsweep.cli.app import app
try:
    app(["audit", "--framework", sys.argv[1], "--config", sys.argv[2]], standalone_mode=False)
except SystemExit:
    pass
print("torch" in sys.modules)
"""


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    main(parser.parse_args().rounds)
