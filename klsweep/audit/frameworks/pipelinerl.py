"""pipelinerl's reader: its config's KL keys mapped onto klsweep's (PipelineRL 58d3934)."""

from __future__ import annotations

import copy
import os
import warnings
from pathlib import Path
from typing import Any

from klsweep.audit.frameworks import files
from klsweep.audit.frameworks.reading import Reading, Terms, term
from klsweep.errors import Problem, UserError

NAME = "pipelinerl"
VERSION = "PipelineRL 58d3934"
KIND = "yaml"  # a YAML mapping or Hydra overrides
ROOT = "conf"  # PipelineRL's launcher: @hydra.main(config_path="../conf"); a group is a folder under it


def _root(path: Path) -> Path:
    """The config folder a file's ``defaults:`` are resolved in: the nearest folder named ``conf`` at or above
    the file (within its repository's tree), else the file's own folder."""
    real = Path(os.path.realpath(path))
    tree = files.tree_of(path)
    for above in real.parents:
        if above.name == ROOT and above.is_relative_to(tree):
            return above
        if above == tree:
            break
    return real.parent


def _named(entry: Any, group: str) -> list[tuple[str, str]]:
    """The (group, option) configs one ``defaults:`` entry may load: ``name`` (a config of the naming config's
    own group), ``group: option`` / ``override group: option`` / ``optional group@pkg: [a, b]`` (``/group``
    from the root); ``_self_`` and null none."""
    out: list[tuple[str, str]] = []
    if isinstance(entry, str):
        name = entry.split("@", 1)[0].strip()
        if name and name != "_self_":
            out.append(("", name.lstrip("/")) if name.startswith("/") else (group, name))
        return out
    if not isinstance(entry, dict):
        return out
    for key, value in entry.items():
        words = str(key).split()
        name = words[-1].split("@", 1)[0] if words else ""
        if not name or name == "_self_":
            continue
        where = name.lstrip("/") if name.startswith("/") else "/".join(p for p in (group, name) if p)
        for option in value if isinstance(value, list) else [value]:
            if isinstance(option, str) and option:
                out.append((where, option))
    return out


def compose(path: Path, data: dict[str, Any]) -> dict[str, Any]:
    """The config as PipelineRL's Hydra tree composes it (``@hydra.main(config_path="../conf")``): Hydra itself
    composes the ``defaults:`` tree (``base``, ``finetune: base``, ``override finetune: ppo``, ``_self_``) of the
    file named as its path under ``conf/`` (a group's file under its group's package), from the files its
    entries name, each read as the config is (``files.text_of`` within the config's tree, ``files.yaml_data``)
    and handed to Hydra in memory (its ConfigStore), never opened by Hydra; more than ``files.MAX_PARENTS`` files is
    refused, as is a tree Hydra refuses (a missing option, a cycle), in Hydra's words."""
    if "defaults" not in data:  # nothing to compose (Hydra not imported)
        return data
    root, tree = _root(path), files.tree_of(path)
    real = Path(os.path.realpath(path))
    name = real.relative_to(root).with_suffix("").as_posix()
    nodes: dict[str, dict[str, Any]] = {name: data}
    todo = [(name, data)]
    while todo:
        at, node = todo.pop()
        group = at.rpartition("/")[0]
        defaults = node.get("defaults")
        for entry in defaults if isinstance(defaults, list) else []:
            for where, option in _named(entry, group):
                key = f"{where}/{option}" if where else option
                parent = root / f"{key}.yaml"
                if key in nodes or not os.path.lexists(parent):  # not there: Hydra names it missing
                    continue
                parent_data = files.parent_mapping(parent, tree, str(path), len(nodes), empty=True)
                nodes[key] = parent_data
                todo.append((key, parent_data))
    return _hydra_compose(path, name, nodes)


def _hydra_compose(path: Path, name: str, nodes: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Hydra's composition of ``name`` from ``nodes`` (config name: its data), registered in a private copy of
    Hydra's ConfigStore (restored after) with no config folder: Hydra reads no file."""
    from hydra import compose as hydra_compose
    from hydra import initialize
    from hydra.core.config_store import ConfigStore
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.plugins import Plugins
    from omegaconf import OmegaConf

    Plugins.instance()  # Hydra's plugins register their configs (hydra/sweeper/basic, ...) before the copy
    store = ConfigStore.instance()
    saved = store.repo
    store.repo = copy.deepcopy(saved)
    GlobalHydra.instance().clear()
    try:
        for key, node in nodes.items():
            group, _, option = key.rpartition("/")
            store.store(name=option, group=group or None, node=copy.deepcopy(node))
        with initialize(version_base=None), warnings.catch_warnings():
            warnings.simplefilter(
                "ignore"
            )  # "Defaults list is missing `_self_`": composed as Hydra 1.1+ does
            config = hydra_compose(config_name=name)
        return OmegaConf.to_container(config, resolve=False)  # type: ignore[return-value]
    except UserError:
        raise
    except Exception as e:  # noqa: BLE001 (Hydra's own refusals: a missing option, a cycle, a bad override)
        what = f"{type(e).__name__}: {e}".splitlines()[0]
        raise UserError(
            Problem(
                str(path), f"PipelineRL's Hydra cannot compose it: {what}", "a config its launcher composes"
            )
        ) from e
    finally:
        store.repo = saved
        GlobalHydra.instance().clear()


def read(r: Reading) -> Terms:
    """PipelineRL 58d3934 (conf/finetune/base.yaml, pipelinerl/finetune/rl/__init__.py): finetune.rl.kl_coef (0)
    decayed linearly towards final_kl_coef (= kl_coef) over completed steps / max steps, k3 on the log-ratio
    clamped at clamp_log_ratio_ref_new_value (5) in the loss; none under policy_loss gspo."""
    p = "finetune.rl."
    if not any(k.startswith("finetune.") for k in r.settings):
        r.problems.append(
            Problem(
                "finetune",
                "no finetune: section (PipelineRL's trainer reads cfg.finetune.rl; a group's file such as "
                "streams/ or rewards/ is not a training config)",
                "an experiment config under conf/ (its defaults: compose finetune: base) or finetune.rl.* settings",
            )
        )
        return [], True
    beta = r.get(f"{p}kl_coef", 0.0, float)
    final = r.get(f"{p}final_kl_coef", beta, float)
    clamp = r.get(f"{p}clamp_log_ratio_ref_new_value", 5.0, float)
    policy_loss = r.choice(f"{p}policy_loss", "reinforce", ("ppo", "reinforce", "gspo"))
    if r.get(f"{p}reward_minus_kl_coef", 0.0, float):
        r.warnings.append(
            "finetune.rl.reward_minus_kl_coef: RLOO's implicit KL in the reward, not one of the audited terms; "
            "not audited"
        )
    if policy_loss == "gspo" and (beta or final):
        r.warnings.append(
            f"finetune.rl.kl_coef {beta:g} is ignored under policy_loss gspo: rl_step adds no KL"
        )
        return [], True
    if beta == 0 and final == 0:
        return [], True
    decay = {"beta_final": final} if final != beta else {}
    if decay:
        r.warnings.append(
            f"kl_coef decays from {beta:g} towards {final:g} (never reached: the last step's is one step short); "
            "audited at the first"
        )
    return [("loss", term("loss", "k3", beta, log_ratio_clamp=clamp, beta_final_at="end", **decay))], True
