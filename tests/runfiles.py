"""Run configs for the job and fault tests: a few fast steps of an untrained tiny model (tests/ is on sys.path
under pytest)."""

from __future__ import annotations

from pathlib import Path

TRAIN = {  # a few fast steps of the untrained tiny model
    "train.steps": 3,
    "train.save_steps": 2,
    "train.prompts_per_step": 2,
    "train.group_size": 4,
    "train.max_completion_length": 8,
    "train.learning_rate": 1e-3,
    "kl.beta": 0.1,
    "wandb.mode": "disabled",
}


def write_config(run_dir: Path, model_dir: Path, **values) -> dict:
    """The resolved config of a run of ``model_dir`` (``TRAIN``, then ``values``: dotted keys), written to
    ``run_dir`` as ``klsweep train`` would read it."""
    from omegaconf import OmegaConf

    from klsweep.config import RunConfig, write_run

    config = OmegaConf.structured(RunConfig)
    for key, value in {"name": "jobtest", "model.path": str(model_dir), **TRAIN, **values}.items():
        OmegaConf.update(config, key, value)
    resolved = OmegaConf.to_container(config)
    write_run(run_dir, resolved)
    return resolved


_KILLABLE = """
import os, signal, sys
from klsweep import job, store
{setup}
append = store.append_jsonl
def append_then_stop(path, row):  # stopped right after step 3's metrics: killed there, never later
    append(path, row)
    if path.name == store.METRICS_FILE and row.get("step") == 3:
        os.kill(os.getpid(), signal.SIGSTOP)
store.append_jsonl = append_then_stop
if __name__ == "__main__":
    job.train_run(sys.argv[1])
"""


def kill_after_step_3(run_dir: Path, env: dict[str, str], timeout_s: float, setup: str = "") -> None:
    """Train ``run_dir`` in a new process (``job.train_run``, after the Python lines ``setup``) that stops itself
    right after writing step 3's metrics, and SIGKILL it there: a crash at a known step, never later."""
    import signal
    import subprocess
    import sys
    import time

    from klsweep import store

    script = run_dir.parent / f"killable-{run_dir.name}.py"
    script.write_text(_KILLABLE.format(setup=setup))
    proc = subprocess.Popen([sys.executable, str(script), str(run_dir)], env=env, stdout=subprocess.DEVNULL)
    try:
        deadline = time.time() + timeout_s
        while time.time() < deadline and not any(r["step"] >= 3 for r in store.read_metrics(run_dir)):
            assert proc.poll() is None, (
                f"the run ended before it could be killed: {store.read_status(run_dir)}"
            )
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()


# A trainer on another node of a shared file system (NFS: a folder's lock is each node's own): it removes the
# first trainer's lock file, as a user did, locks a new one in its place and holds it. Argument: the run folder.
OTHER_NODE = """
import fcntl, json, os, sys, time
# a trainer on another node of a shared file system: the folder's lock is that node's own, so it only
# removes the first trainer's lock file (as a user did) and locks a new one
path = os.path.join(sys.argv[1], ".train.lock")
os.unlink(path)
fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL)
fcntl.flock(fd, fcntl.LOCK_EX)
os.write(fd, json.dumps({"pid": os.getpid(), "host": "node2"}).encode())
print("locked", flush=True)
time.sleep(600)
"""
