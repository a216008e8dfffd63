"""AReaL's own config loading, executed from the areal 1.0.4 wheel (the version klsweep's AReaL reader and preset
cite): areal/api/cli_args.py run as a module from the wheel's files, its ``parse_cli_args`` (Hydra composes the
file) and ``to_structured_cfg`` (merged over the dataclass defaults of ``GRPOConfig``) then
``OmegaConf.to_object`` (the dataclasses' own checks), as ``load_expr_config`` does before it touches the
cluster. Its own imports from the wheel: areal.utils.constants, areal.utils.pkg_version,
areal.engine.fsdp_utils.attn_impl; stubbed, as they decide nothing about a config: uvloop.install, the logger,
name_resolve (a cluster service) and areal.utils.seqpack (numba; its PACKING_ALGORITHMS read from its text).

A file is trained by AReaL's RL trainer (areal/trainer/rl_trainer.py, which builds the reference at 178-181
only from ``ref:``) when it holds PPOConfig's generation sections (``rollout:`` or ``gconfig:``); SFTConfig,
RWConfig and DPOConfig have neither (DPO's ``ref:`` is its loss's reference, not a KL penalty): ``reference``
false, as for an RL config without ``ref:``."""

from __future__ import annotations

import contextlib
import logging
import sys
import types
import zipfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parents[1]))
from peers import cache_dir, wheel_path  # noqa: E402
from test_executed import WHEELS  # noqa: E402

LOADER = (
    "areal 1.0.4 wheel, executed: areal/api/cli_args.py parse_cli_args, to_structured_cfg(GRPOConfig), "
    "OmegaConf.to_object (a file for the example's own subclass of GRPOConfig: merged over GRPOConfig with "
    "struct mode off)"
)
MODULES = ("areal/api/cli_args.py", "areal/utils/constants.py", "areal/utils/pkg_version.py",
           "areal/engine/fsdp_utils/attn_impl.py", "areal/utils/seqpack.py")  # fmt: skip
_cli: dict[str, Any] = {}


def available() -> bool:
    try:
        return wheel_path(WHEELS["areal"]).exists()
    except Exception:  # noqa: BLE001 (offline: the committed readings stand)
        return False


def _unpacked() -> Path:
    """The modules above, written out of the wheel under klsweep's cache (Hydra resolves the config's folder
    relative to cli_args.py's own file)."""
    root = cache_dir() / "areal-1.0.4-modules"
    with zipfile.ZipFile(wheel_path(WHEELS["areal"])) as archive:
        for module in MODULES:
            target = root / module
            if not target.exists():
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(archive.read(module))
    return root


def _module(name: str, path: Path | None = None, **names: Any) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__dict__.update(names)
    if path is not None:
        module.__file__ = str(path)
        exec(compile(path.read_text(), str(path), "exec"), module.__dict__)  # noqa: S102 (AReaL's own module)
    return module


def cli_args() -> dict[str, Any]:
    """areal.api.cli_args's namespace, executed once (its areal imports answered as the docstring says)."""
    if _cli:
        return _cli
    root = _unpacked()
    packing = {"ffd", "kk"}  # seqpack.py 162-164: PACKING_ALGORITHM_FFD, PACKING_ALGORITHM_KK
    own = {
        "uvloop": _module("uvloop", install=lambda: None),
        "areal.utils.logging": _module("areal.utils.logging", getLogger=logging.getLogger),
        "areal.utils.name_resolve": _module("areal.utils.name_resolve", reconfigure=lambda *a, **k: None),
        "areal.utils.seqpack": _module("areal.utils.seqpack", PACKING_ALGORITHMS=packing),
        "areal.utils.constants": _module("areal.utils.constants", root / "areal/utils/constants.py"),
        "areal.utils.pkg_version": _module("areal.utils.pkg_version", root / "areal/utils/pkg_version.py"),
        "areal.engine.fsdp_utils.attn_impl": _module(
            "areal.engine.fsdp_utils.attn_impl", root / "areal/engine/fsdp_utils/attn_impl.py"
        ),
    }
    own["areal.utils"] = _module(
        "areal.utils", **{k.rsplit(".", 1)[1]: v for k, v in own.items() if k.startswith("areal.utils.")}
    )
    saved = {name: sys.modules.get(name) for name in own}
    sys.modules.update(own)
    try:
        # registered while it runs and after (dataclasses and OmegaConf look their module up by name)
        module = sys.modules["areal.api.cli_args"] = types.ModuleType("areal.api.cli_args")
        module.__file__ = str(root / "areal/api/cli_args.py")
        exec(compile(Path(module.__file__).read_text(), module.__file__, "exec"), module.__dict__)  # noqa: S102
        _cli.update(module.__dict__)
    finally:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module
    return _cli


def expected(file: Path, files: Path) -> dict[str, Any]:
    """The keys klsweep reads, as AReaL 1.0.4 resolves them for ``file``."""
    from omegaconf import OmegaConf
    from omegaconf.errors import ConfigKeyError

    ns = cli_args()
    try:
        with contextlib.chdir(file.parent):
            cfg, _ = ns["parse_cli_args"](["--config", str(file)])
        if "rollout" not in cfg and "gconfig" not in cfg:
            return {"values": {"reference": False}}
        try:
            config = OmegaConf.to_object(ns["to_structured_cfg"](cfg, config_cls=ns["GRPOConfig"]))
        except ConfigKeyError:
            # keys of the example's own subclass of GRPOConfig (its entry script's): merged over GRPOConfig's
            # defaults with struct mode off, read as OmegaConf resolves them
            default = OmegaConf.structured(ns["GRPOConfig"])
            OmegaConf.set_struct(default, False)
            config = OmegaConf.merge(default, cfg)
    except Exception as e:  # noqa: BLE001 (AReaL's own refusal)
        return {"refused": f"{type(e).__name__}: {e}".replace(str(files) + "/", "")}
    if config.ref is None:
        return {"values": {"reference": False}}
    actor, norm = config.actor, config.actor.reward_norm
    return {
        "values": {
            "reference": True,
            "actor.kl_ctl": actor.kl_ctl,
            "actor.kl_estimator": actor.kl_estimator,
            "actor.reward_norm.mean_level": None if norm is None else norm.mean_level,
            "actor.reward_norm.std_level": None if norm is None else norm.std_level,
        }
    }
