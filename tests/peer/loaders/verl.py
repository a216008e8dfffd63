"""verl 0.9.1's loader, executed: its Hydra config (verl/trainer/config/ from the pinned wheel,
tests/peer/test_executed.py WHEELS) composed as ``verl.trainer.main_ppo`` composes it
(``@hydra.main(config_path="config", config_name="ppo_trainer")``) with the overrides the launch script passes
(bash runs the script, tests/peer/loaders/launch.py), ``--config-name`` honoured; a YAML file is a config of that
directory (its ``defaults:`` resolved by Hydra) or, with no ``defaults:``, merged into ppo_trainer as verl's
structured config allows (a key verl does not have is refused, as Hydra refuses it)."""

from __future__ import annotations

import shutil
import tempfile
import zipfile
from pathlib import Path
from typing import Any

from loaders import launch

LOADER = "verl 0.9.1 wheel: verl/trainer/config (Hydra compose, as verl.trainer.main_ppo) + bash for scripts"
ENTRY = ("verl.trainer.main_ppo",)
# the keys klsweep's verl reader reads (klsweep/audit/frameworks/verl.py)
KEYS = (
    "algorithm.adv_estimator",
    "algorithm.use_kl_in_reward",
    "actor_rollout_ref.actor.use_kl_loss",
    "algorithm.kl_ctrl.type",
    "algorithm.kl_ctrl.kl_coef",
    "actor_rollout_ref.actor.kl_loss_coef",
    "algorithm.kl_ctrl.target_kl",
    "algorithm.kl_ctrl.horizon",
    "algorithm.kl_penalty",
    "actor_rollout_ref.actor.kl_loss_type",
    "algorithm.norm_adv_by_std_in_grpo",
    "algorithm.gamma",
)


def available() -> bool:
    from peers import cache_dir
    from test_executed import WHEELS

    return (cache_dir() / WHEELS["verl"].filename).is_file() and launch.environment_is_clean()


def _config_dir(into: Path) -> Path:
    from peers import wheel_path
    from test_executed import WHEELS

    with zipfile.ZipFile(wheel_path(WHEELS["verl"])) as archive:
        for name in archive.namelist():
            if name.startswith("verl/trainer/config/") and name.endswith(".yaml"):
                out = into / name[len("verl/trainer/config/") :]
                out.parent.mkdir(parents=True, exist_ok=True)
                out.write_bytes(archive.read(name))
    return into


def _values(config: Any) -> dict[str, Any]:
    from omegaconf import OmegaConf

    out = {}
    for key in KEYS:
        value = OmegaConf.select(config, key, throw_on_missing=True)
        out[key] = OmegaConf.to_container(value) if OmegaConf.is_config(value) else value
    return out


def _compose(folder: Path, name: str, overrides: list[str], then: Any = None) -> dict[str, Any]:
    """Hydra's composition of config ``name`` in ``folder`` with ``overrides`` (then ``then(config)``): the
    values of ``KEYS``, or Hydra's or OmegaConf's refusal (what verl's main would exit with)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(folder), version_base=None):
            config = compose(config_name=name, overrides=overrides)
            return {"values": _values(then(config) if then else config)}
    except Exception as e:
        return {"refused": f"{type(e).__name__}: {e}".splitlines()[0]}
    finally:
        GlobalHydra.instance().clear()


def _merged(folder: Path, data: Any) -> dict[str, Any]:
    """A YAML without ``defaults:`` merged into ppo_trainer (verl's structured config: a key it does not have
    is refused)."""
    from omegaconf import OmegaConf

    return _compose(folder, "ppo_trainer", [], lambda config: OmegaConf.merge(config, OmegaConf.create(data)))


def expected(file: Path, files: Path) -> dict[str, Any]:
    import yaml

    with tempfile.TemporaryDirectory(prefix="verl-config-") as work:
        folder = _config_dir(Path(work) / "config")
        if file.suffix in (".yaml", ".yml"):
            data = yaml.safe_load(file.read_text())
            if isinstance(data, dict) and "defaults" in data:  # a config of verl's directory
                shutil.copy(file, folder / file.name)
                return _compose(folder, file.stem, [])
            return _merged(folder, data)
        try:
            args = launch.arguments_after(file, ENTRY, launch.environment_of(file, files))
        except launch.Refused as e:
            return {"refused": str(e)}
        name, overrides = "ppo_trainer", []
        skip = False
        for i, arg in enumerate(args):
            if skip:
                skip = False
                continue
            if arg.startswith("--config-name"):
                name, skip = (arg.split("=", 1)[1], False) if "=" in arg else (args[i + 1], True)
            elif arg.startswith("--config-path"):
                path, skip = (arg.split("=", 1)[1], False) if "=" in arg else (args[i + 1], True)
                if path.strip("'\"") not in ("config", "verl/trainer/config"):  # main_ppo's own, relative
                    return {"refused": f"--config-path {path}: a config directory outside verl's own"}
            else:
                overrides.append(arg)
        return _compose(folder, name.removesuffix(".yaml"), overrides)


def config_keys() -> dict[str, list[str]]:
    """Every key (sections and leaves, dotted) of verl 0.9.1's composed ppo_trainer and ppo_megatron_trainer: what
    Hydra lets a launch command override without ``+`` (klsweep/assets/frameworks/verl-0.9.1-keys.json)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import DictConfig

    def walk(node: Any, prefix: str, out: set[str]) -> None:
        for key in node:
            out.add(name := f"{prefix}{key}")
            child = node._get_node(key)
            if isinstance(child, DictConfig) and not (
                child._is_none() or child._is_missing() or child._is_interpolation()
            ):
                walk(child, name + ".", out)

    result = {}
    with tempfile.TemporaryDirectory(prefix="verl-config-") as work:
        folder = _config_dir(Path(work) / "config")
        for name in ("ppo_trainer", "ppo_megatron_trainer"):
            GlobalHydra.instance().clear()
            try:
                with initialize_config_dir(config_dir=str(folder), version_base=None):
                    config = compose(config_name=name)
            finally:
                GlobalHydra.instance().clear()
            keys: set[str] = set()
            walk(config, "", keys)
            result[name] = sorted(keys)
    return result
