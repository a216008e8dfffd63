"""SkyRL 0.4.0's loader, executed: ``SkyRLTrainConfig.from_cli_overrides`` (skyrl/train/config/config.py, what
``skyrl.train.entrypoints.main_base`` calls on ``sys.argv[1:]``: OmegaConf's CLI parse, the nested dataclasses,
their ``__post_init__`` checks) from the pinned wheel, imported in a subprocess from the wheel's files with three
stand-ins that touch no config value: loguru's logger (a no-op), the ``skyrl.backends`` package namespaces (so
their ``__init__`` does not import Ray and cloud clients) and ``inference_servers.utils._uses_lora_weight_sync``
(False: a LoRA weight-sync check of the inference engines). The launch script is run by bash
(tests/peer/loaders/launch.py) and the arguments after ``skyrl.train.entrypoints.main_base`` are the overrides.
A YAML file is not a SkyRL config (SkyRL reads its command line): refused by ``from_cli_overrides`` of its
keys, as a dotted override each. A script whose entry point is one of SkyRL's examples with its own config class
(``examples.train.thunder_agent.main_harbor_thunder_agent``: ``ThunderAgentHarborConfig.from_cli_overrides``) is
read by that class, from the example's ``training_config.py`` at a956457 (verbatim as training_config.py.txt in
tests/peer/loaders/skyrl_examples/, with SkyRL's LICENSE) over the wheel's ``make_config``."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Any

from loaders import launch

LOADER = "skyrl 0.4.0 wheel: SkyRLTrainConfig.from_cli_overrides (in a subprocess) + bash for scripts"
ENTRY = ("skyrl.train.entrypoints.main_base",)
# an example's own entry point and the config class it parses with (a file of tests/peer/loaders/skyrl_examples/)
EXAMPLES = {
    "examples.train.thunder_agent.main_harbor_thunder_agent": (
        "training_config.py.txt",
        "ThunderAgentHarborConfig",
    )
}
EXAMPLE_DIR = Path(__file__).parent / "skyrl_examples"
P = "trainer.algorithm."
# the keys klsweep's SkyRL reader reads (klsweep/audit/frameworks/skyrl.py)
KEYS = tuple(
    P + k
    for k in (
        "kl_estimator_type",
        "kl_loss_coef",
        "use_kl_loss",
        "use_kl_in_reward",
        "advantage_estimator",
        "kl_ctrl.type",
        "kl_ctrl.kl_target",
        "kl_ctrl.horizon",
        "grpo_norm_by_std",
        "gamma",
        "advantage_batch_normalize",
    )
)

RUN = r"""
import json, sys, types
root = sys.argv[1]
sys.path[:0] = [root, root + "/skyrl-gym"]
noop = lambda *a, **k: None
sys.modules["loguru"] = types.SimpleNamespace(logger=types.SimpleNamespace(
    info=noop, warning=noop, debug=noop, error=noop, exception=noop, opt=lambda *a, **k: None))
for name in ("skyrl.backends", "skyrl.backends.skyrl_train", "skyrl.backends.skyrl_train.inference_servers"):
    m = types.ModuleType(name); m.__path__ = [root + "/" + name.replace(".", "/")]; sys.modules[name] = m
u = types.ModuleType("skyrl.backends.skyrl_train.inference_servers.utils")
u._uses_lora_weight_sync = lambda *a, **k: False
sys.modules[u.__name__] = u
from omegaconf import OmegaConf
from skyrl.train.config.config import SkyRLTrainConfig
keys, (module_file, cls) = json.loads(sys.argv[2]), json.loads(sys.argv[3])
if module_file:  # an example's own config class (skyrl.train.utils's __init__ imports Ray: its namespace only)
    m = types.ModuleType("skyrl.train.utils"); m.__path__ = [root + "/skyrl/train/utils"]
    sys.modules[m.__name__] = m
    import importlib.machinery, importlib.util  # the file kept as .txt: not linted, byte for byte the example's
    source = importlib.machinery.SourceFileLoader("example_training_config", module_file)
    spec = importlib.util.spec_from_loader("example_training_config", source)
    module = importlib.util.module_from_spec(spec); spec.loader.exec_module(module)
    SkyRLTrainConfig = getattr(module, cls)
try:
    cfg = OmegaConf.structured(SkyRLTrainConfig.from_cli_overrides(sys.argv[4:]))
except Exception as e:
    print(json.dumps({"refused": f"{type(e).__name__}: {e}".splitlines()[0]}))
else:
    out = {}
    for k in keys:
        v = OmegaConf.select(cfg, k)
        out[k] = v.value if hasattr(v, "value") and not isinstance(v, (int, float, str, bool)) else v
    print(json.dumps({"values": out}))
"""


def available() -> bool:
    from peers import cache_dir
    from test_executed import WHEELS

    return (cache_dir() / WHEELS["skyrl"].filename).is_file() and launch.environment_is_clean()


def _run(overrides: list[str], config: tuple[str, str] = ("", "")) -> dict[str, Any]:
    from peers import wheel_path
    from test_executed import WHEELS

    with tempfile.TemporaryDirectory(prefix="skyrl-wheel-") as work:
        with zipfile.ZipFile(wheel_path(WHEELS["skyrl"])) as archive:
            archive.extractall(work)
        done = subprocess.run(
            [sys.executable, "-c", RUN, work, json.dumps(KEYS), json.dumps(config), *overrides],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    if done.returncode != 0:
        raise RuntimeError(f"SkyRL's loader failed: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def expected(file: Path, files: Path) -> dict[str, Any]:
    if file.suffix in (".yaml", ".yml"):
        import yaml

        from klsweep.audit.frameworks.files import _flatten  # the dotted keys of a mapping (no reading)

        data = yaml.safe_load(file.read_text())
        flat = _flatten(data) if isinstance(data, dict) else {}
        return _run([f"{k}={v if isinstance(v, str) else json.dumps(v)}" for k, v in flat.items()])
    environment = launch.environment_of(file, files)
    for entry, (module, cls) in EXAMPLES.items():
        try:
            args = launch.arguments_after(file, (entry,), environment)
        except launch.Refused:
            continue
        return _run(args, (str(EXAMPLE_DIR / module), cls))
    try:
        args = launch.arguments_after(file, ENTRY, environment)
    except launch.Refused as e:
        return {"refused": str(e)}
    return _run(args)
