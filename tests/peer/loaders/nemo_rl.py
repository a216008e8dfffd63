"""NeMo-RL's own config loading at NVIDIA-NeMo/RL 7ea279a, transcribed verbatim (NeMo-RL is not on the registry)
and executed on each corpus file: the ``defaults:`` chain (nemo_rl/utils/config.py), the resolution
examples/run_grpo.py and run_ppo.py apply (``OmegaConf.to_container(config, resolve=True)`` after
``register_omegaconf_resolvers``), and the pydantic models that read the KL keys: ClippedPGLossConfig
(nemo_rl/algorithms/loss/loss_functions.py) and AdvEstimatorConfig (nemo_rl/algorithms/advantage_estimator.py),
with GRPOConfig's and PPOConfig's defaults of ``adv_estimator`` (nemo_rl/algorithms/grpo.py 304, ppo.py 197-203).
ClippedPGLossConfig is built only by the GRPO and PPO entry points (their master configs' ``grpo:``/``ppo:``):
a config with neither trains no policy against a reference with it (``reference`` false)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional, Union, cast

from omegaconf import DictConfig, ListConfig, OmegaConf
from pydantic import BaseModel, ValidationError

LOADER = (
    "NVIDIA-NeMo/RL 7ea279a transcribed: nemo_rl/utils/config.py:23-97,195-204 (load_config_with_inheritance), "
    "nemo_rl/algorithms/loss/loss_functions.py:111-164 (ClippedPGLossConfig), "
    "nemo_rl/algorithms/advantage_estimator.py:44-55 (AdvEstimatorConfig)"
)
LOSS_KEYS = (
    "reference_policy_kl_penalty", "reference_policy_kl_type", "kl_input_clamp_value", "kl_output_clamp_value",
    "use_on_policy_kl_approximation", "use_kl_in_reward",
)  # fmt: skip

# NVIDIA-NeMo/RL 7ea279a nemo_rl/utils/config.py:23-97
CONFIG = '''\
def resolve_path(base_path: Path, path: str) -> Path:
    """Resolve a path relative to the base path."""
    if path.startswith("/"):
        return Path(path)
    return base_path / path


def merge_with_override(
    base_config: DictConfig, override_config: DictConfig
) -> DictConfig:
    """Merge configs with support for _override_ marker to completely override sections."""
    for key in list(override_config.keys()):
        # Keep mandatory values (``???``) unresolved while composing configs.
        # A child config or a CLI override may provide them after inheritance.
        if OmegaConf.is_missing(override_config, key):
            continue
        if isinstance(override_config[key], DictConfig):
            if override_config[key].get("_override_", False):
                # remove the _override_ marker
                override_config[key].pop("_override_")
                # remove the key from base_config so it won't be merged
                if key in base_config:
                    base_config.pop(key)

    merged_config = cast(DictConfig, OmegaConf.merge(base_config, override_config))
    return merged_config


def load_config_with_inheritance(
    config_path: Union[str, Path],
    base_dir: Optional[Union[str, Path]] = None,
) -> DictConfig:
    """Load a config file with inheritance support.

    Args:
        config_path: Path to the config file
        base_dir: Base directory for resolving relative paths. If None, uses config_path's directory

    Returns:
        Merged config dictionary
    """
    config_path = Path(config_path)
    if base_dir is None:
        base_dir = config_path.parent
    base_dir = Path(base_dir)

    config = OmegaConf.load(config_path)
    assert isinstance(config, DictConfig), (
        "Config must be a Dictionary Config (List Config not supported)"
    )

    # Handle inheritance
    if "defaults" in config:
        defaults = config.pop("defaults")
        if isinstance(defaults, (str, Path)):
            defaults = [defaults]
        elif isinstance(defaults, ListConfig):
            defaults = [str(d) for d in defaults]

        # Load and merge all parent configs
        base_config = OmegaConf.create({})
        for default in defaults:
            parent_path = resolve_path(base_dir, str(default))
            # Use parent's directory as base_dir for resolving its own defaults
            parent_config = load_config_with_inheritance(
                parent_path, parent_path.parent
            )
            base_config = cast(
                DictConfig, merge_with_override(base_config, parent_config)
            )

        # Merge with current config
        config = cast(DictConfig, merge_with_override(base_config, config))

    return config
'''

# NVIDIA-NeMo/RL 7ea279a nemo_rl/utils/config.py:195-204
RESOLVERS = '''\
def register_omegaconf_resolvers() -> None:
    """Register shared OmegaConf resolvers used in configs."""
    if not OmegaConf.has_resolver("add"):
        OmegaConf.register_new_resolver("add", lambda a, b: a + b)
    if not OmegaConf.has_resolver("mul"):
        OmegaConf.register_new_resolver("mul", lambda a, b: a * b)
    if not OmegaConf.has_resolver("div"):
        OmegaConf.register_new_resolver("div", lambda a, b: a / b)
    if not OmegaConf.has_resolver("max"):
        OmegaConf.register_new_resolver("max", lambda a, b: max(a, b))
'''

# NVIDIA-NeMo/RL 7ea279a nemo_rl/algorithms/loss/loss_functions.py:111-164
LOSS_CONFIG = """\
class ClippedPGLossConfig(BaseModel, extra="allow"):
    # --- Loss type ---
    disable_ppo_ratio: bool = False
    token_level_loss: bool = True
    # If True, apply the off-policy importance-sampling correction at the
    # sequence level (one weight per generated sample), as in GSPO.
    # If False (default), correction is applied at the token level as in the
    # original GRPO paper.
    sequence_level_importance_ratios: bool = False

    # --- Clipping ---
    ratio_clip_min: float = 0.2
    ratio_clip_max: float = 0.2
    # Dual-clipping value (should be >1 if enabled; usually set to 3 empirically). None to disable.
    ratio_clip_c: Optional[float] = None

    # --- KL regularization ---
    reference_policy_kl_penalty: float = 0.01
    # Can be set to k1, k2, k3
    # For more details, see http://joschu.net/blog/kl-approx.html
    reference_policy_kl_type: str = "k3"
    kl_input_clamp_value: Optional[float] = 20.0
    kl_output_clamp_value: Optional[float] = 10.0
    # If True, add KL penalty to reward instead of loss (used by Reinforce++)
    use_kl_in_reward: bool = False

    # --- Importance sampling correction ---
    # Async GRPO requires importance sampling correction enabled
    # Set to true when async_grpo.enabled is true
    use_importance_sampling_correction: bool = False
    # --- Truncated importance sampling ---
    # Type of truncated importance sampling:
    #   "tis"          – clamp IS weights to [min, max], where min defaults to 0
    #   "icepop"       – zero out tokens with IS weight outside [min, max]
    #   "seq-mask-tis" – zero out sequences by geometric-mean IS ratio, non-truncated token IS correction
    truncated_importance_sampling_type: Optional[str] = None
    truncated_importance_sampling_ratio: Optional[float] = None
    # Lower bound for TIS clipping, ICE-POP filtering, or seq-mask-tis filtering
    truncated_importance_sampling_ratio_min: Optional[float] = None

    # --- On-policy ---
    # (default off) loss formulation improvements (docs/guides/grpo.md#loss)
    use_on_policy_kl_approximation: bool = False
    # If True, force the ratio to 1.0 for truly on-policy behavior,
    # eliminating any importance sampling effects.
    # NOTE: This should only be used when doing exactly one update per rollout
    # (i.e., num_prompts_per_step * num_generations_per_prompt == train_global_batch_size)
    force_on_policy_ratio: bool = False
    # If True, use CISPO (Clipped IS-weight Policy Optimization) from MiniMax-M1.
    use_cispo: bool = False
    # VAPO: weight μ for positive-example NLL loss on correct samples.
    # L = L_PPO + μ·L_NLL(correct)   (arXiv:2504.05118, Eq. 10)
    # Set to 0 to disable.
    positive_example_nll_weight: float = 0.0
"""

# NVIDIA-NeMo/RL 7ea279a nemo_rl/algorithms/advantage_estimator.py:44-55
ADV_CONFIG = '''\
class AdvEstimatorConfig(BaseModel, extra="allow"):
    """Configuration for advantage estimator (GRPO, GDPO, or Reinforce++)."""

    name: str = "grpo"  # "grpo", "gdpo", or "reinforce_plus_plus"
    # GRPO specific
    normalize_rewards: bool = True
    use_leave_one_out_baseline: bool = True
    # GDPO specific: optional per-component weights w_n for the aggregation.
    reward_weights: list[float] | None = None
    # Reinforce++ specific
    minus_baseline: bool = True

'''

NEMO: dict[str, Any] = {
    "__name__": __name__, "Path": Path, "Optional": Optional, "Union": Union, "cast": cast,
    "DictConfig": DictConfig, "ListConfig": ListConfig, "OmegaConf": OmegaConf, "BaseModel": BaseModel,
}  # fmt: skip
for _source, _file in (
    (CONFIG, "nemo_rl/utils/config.py"),
    (RESOLVERS, "nemo_rl/utils/config.py"),
    (LOSS_CONFIG, "nemo_rl/algorithms/loss/loss_functions.py"),
    (ADV_CONFIG, "nemo_rl/algorithms/advantage_estimator.py"),
):
    exec(compile(_source, _file, "exec"), NEMO)  # noqa: S102 (NeMo-RL's own definitions, nothing else)


def expected(file: Path, files: Path) -> dict[str, Any]:
    """The keys klsweep reads, as NeMo-RL resolves them for ``file``."""
    NEMO["register_omegaconf_resolvers"]()
    try:
        config = NEMO["load_config_with_inheritance"](file)
        algorithm = next((a for a in ("grpo", "ppo") if a in config), None)
        if algorithm is None:
            return {"values": {"reference": False}}
        # the sections the KL keys are read from, resolved as run_grpo.py / run_ppo.py resolve the whole config
        # (the rest, an ${oc.env:HF_HOME} in a dataset's path, left alone: it decides nothing here)
        loss_fn = OmegaConf.to_container(config["loss_fn"], resolve=True) if "loss_fn" in config else {}
        section = OmegaConf.to_container(config[algorithm], resolve=True) or {}
    except Exception as e:  # noqa: BLE001 (the loader's own refusal)
        return {"refused": f"{type(e).__name__}: {e}".replace(str(files) + "/", "")}
    try:
        loss = NEMO["ClippedPGLossConfig"](**loss_fn or {})
        if "adv_estimator" in section:
            estimator = NEMO["AdvEstimatorConfig"](**section["adv_estimator"]).name
        else:  # GRPOConfig's default_factory AdvEstimatorConfig; PPOConfig's name="gae"
            estimator = "grpo" if algorithm == "grpo" else "gae"
    except ValidationError as e:
        return {"refused": str(e)}
    values = {f"loss_fn.{k}": getattr(loss, k) for k in LOSS_KEYS}
    return {"values": values | {f"{algorithm}.adv_estimator.name": estimator, "reference": True}}
