"""nemo-rl's reader: its config's KL keys mapped onto klsweep's (NeMo-RL 7ea279a)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from klsweep.audit.frameworks import files
from klsweep.audit.frameworks.reading import Reading, Terms, term
from klsweep.errors import Problem, UserError

NAME = "nemo-rl"
VERSION = "NeMo-RL 7ea279a"
KIND = "yaml"  # a YAML mapping or Hydra overrides


def compose(path: Path, data: dict[str, Any]) -> dict[str, Any]:
    """The config as NeMo-RL composes it (nemo_rl/utils/config.py load_config_with_inheritance, 51-97, and
    merge_with_override, 30-48): ``defaults:`` (a path or a list, relative to the file naming it, or absolute)
    loaded depth-first, each merged over the last, then the file over them; a top-level section marked
    ``_override_: true`` replaces its parents' instead of merging. Every parent is read as the config is
    (``files.text_of`` within the config's tree, ``files.yaml_data``); a cycle, or more than ``files.MAX_PARENTS``
    parent files read in all, is refused (NeMo-RL would recurse without end)."""
    if "defaults" not in data:  # nothing to compose (OmegaConf not imported)
        return data
    from omegaconf import DictConfig, ListConfig, OmegaConf

    tree = files.tree_of(path)

    def merge(base: DictConfig, override: DictConfig) -> DictConfig:
        for key in list(override.keys()):
            if OmegaConf.is_missing(override, key):
                continue
            if isinstance(override[key], DictConfig) and override[key].get("_override_", False):
                override[key].pop("_override_")
                if key in base:
                    base.pop(key)
        return OmegaConf.merge(base, override)  # type: ignore[return-value]

    read: list[str] = []  # every parent file read, for MAX_PARENTS

    def load(where: Path, data: dict[str, Any], chain: list[str]) -> DictConfig:
        config = OmegaConf.create(data)
        if "defaults" not in config:
            return config
        defaults = config.pop("defaults")
        if isinstance(defaults, str):
            defaults = [defaults]
        elif isinstance(defaults, ListConfig):
            defaults = [str(d) for d in defaults]
        else:
            raise UserError(Problem(f"{where}: defaults", f"{defaults!r} is not a path", "a path or a list"))
        base = OmegaConf.create({})
        for default in defaults:
            parent = Path(default) if default.startswith("/") else where.parent / default
            real = os.path.realpath(parent)
            if real in chain:
                raise UserError(
                    Problem(f"{where}: defaults", f"{default} is a cycle", "a chain without cycles")
                )
            read.append(real)
            what = "not a YAML mapping (NeMo-RL: 'Config must be a Dictionary Config')"
            parent_data = files.parent_mapping(parent, tree, str(where), len(read), what)
            base = merge(base, load(parent, parent_data, [*chain, real]))
        return merge(base, config)

    try:
        config = load(path, data, [os.path.realpath(path)])
        return OmegaConf.to_container(config, resolve=False)  # type: ignore[return-value]
    except UserError:
        raise
    except Exception as e:  # noqa: BLE001 (OmegaConf's own refusals: a merge of a value into a section, ...)
        raise UserError(
            Problem(str(path), f"NeMo-RL cannot compose it: {e}", "a config its loader reads")
        ) from e


def read(r: Reading) -> Terms:
    """NeMo-RL 7ea279a (nemo_rl/algorithms/loss/loss_functions.py ClippedPGLossConfig, utils.py calculate_kl):
    loss_fn.reference_policy_kl_penalty (0.01) x calculate_kl of reference_policy_kl_type (k3), clamps
    kl_input_clamp_value (20) and kl_output_clamp_value (10, on weight x KL), weighted by
    exp(logp - logp.detach()) or, with use_on_policy_kl_approximation, by pi/pi_gen; use_kl_in_reward moves it to
    the advantage (advantage_estimator.py, default clamps, no weight)."""
    p = "loss_fn."
    sections = {k.split(".", 1)[0] for k in r.settings}
    algorithm = next((a for a in ("grpo", "ppo") if a in sections), None)
    others = sorted(s for s in sections if s in ("sft", "dpo", "rm", "distillation", "eval"))
    if algorithm is None and (others or "loss_fn" not in sections):
        what = f"a {'/'.join(others)} config" if others else "no loss_fn: section"
        r.no_reference = (
            f"{what}, no grpo: or ppo: section: NeMo-RL trains no policy against a reference with its "
            "ClippedPGLoss here"
        )
        r.values["reference"] = False
        return [], False
    algorithm = algorithm or "grpo"  # a loss_fn: alone (a fragment): read as GRPO's
    r.values["reference"] = True
    beta = r.get(f"{p}reference_policy_kl_penalty", 0.01, float)
    estimator = r.choice(f"{p}reference_policy_kl_type", "k3", ("k1", "k2", "k3"))
    clamp_in = r.get(f"{p}kl_input_clamp_value", 20.0, float, optional=True)
    clamp_out = r.get(f"{p}kl_output_clamp_value", 10.0, float, optional=True)
    approximation = r.get(f"{p}use_on_policy_kl_approximation", False, bool)
    in_reward = r.get(f"{p}use_kl_in_reward", False, bool)
    # GRPOConfig's default AdvEstimatorConfig is grpo, PPOConfig's gae; a section without a name: grpo
    given = any(k.startswith(f"{algorithm}.adv_estimator.") for k in r.settings)
    advantage = r.get(
        f"{algorithm}.adv_estimator.name", "gae" if algorithm == "ppo" and not given else "grpo", str
    )
    grpo = algorithm == "grpo"
    if beta == 0:
        return [], grpo
    if in_reward:  # ClippedPGLossFn: the loss's coefficient 0; only Reinforce++ and GAE add it to the reward
        if advantage not in ("reinforce_plus_plus", "gae"):
            r.warnings.append(
                f"loss_fn.use_kl_in_reward true with {algorithm}.adv_estimator.name {advantage}: no KL at all "
                "(the loss's coefficient is 0 and only the reinforce_plus_plus and gae estimators add the KL to "
                "the reward)"
            )
            return [], grpo
        return [("reward", term("reward", estimator, beta, log_ratio_clamp=20.0, value_clamp=10.0))], grpo
    clamps: dict[str, Any] = {"log_ratio_clamp": clamp_in or 0.0, "value_clamp": clamp_out or 0.0}
    weight = {"importance": "token" if approximation else "self", "importance_gradient": True}
    forms = clamps | weight | {"clamp_weighted": bool(clamp_out), "clamp_detaches_weight": bool(clamp_in)}
    return [("loss", term("loss", estimator, beta, **forms))], grpo
