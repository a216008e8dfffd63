"""PipelineRL 58d3934's loader, transcribed: PipelineRL is not on the registry; its Hydra tree (conf/**/*.yaml at
ServiceNow/PipelineRL 58d3934, held verbatim in tests/peer/loaders/pipelinerl_conf/ with its LICENSE) is composed
by Hydra as its launcher composes it (``@hydra.main(config_path="../conf")``, the experiment's name as the
config), the ``defaults:`` chain and its group overrides resolved by Hydra itself. A group file
(conf/finetune/base.yaml) is composed alone, under its group's package: its ``rl.*`` are ``finetune.rl.*``."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

LOADER = "PipelineRL 58d3934 transcribed: conf/ (tests/peer/loaders/pipelinerl_conf), Hydra compose"
CONF = Path(__file__).parent / "pipelinerl_conf"
P = "finetune.rl."
# the keys klsweep's PipelineRL reader reads (klsweep/audit/frameworks/pipelinerl.py)
KEYS = tuple(
    P + k
    for k in (
        "kl_coef",
        "final_kl_coef",
        "clamp_log_ratio_ref_new_value",
        "policy_loss",
        "reward_minus_kl_coef",
    )
)


def expected(file: Path, files: Path) -> dict[str, Any]:
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf

    name = str(file.relative_to(files / "conf")).removesuffix(".yaml")
    with tempfile.TemporaryDirectory(prefix="pipelinerl-conf-") as work:
        conf = Path(work) / "conf"
        shutil.copytree(CONF, conf)
        shutil.copy(file, conf / f"{name}.yaml")  # the corpus's copy (the same bytes at this commit)
        GlobalHydra.instance().clear()
        try:
            with initialize_config_dir(config_dir=str(conf), version_base=None):
                config = compose(config_name=name)
                values = {}
                for key in KEYS:
                    # a group's file composed alone sits under its group's package (finetune) as Hydra places it;
                    # read as PipelineRL's trainer reads it (cfg.finetune.rl.kl_coef: a config without finetune
                    # is refused by Hydra's struct mode, ConfigAttributeError)
                    node = config
                    for part in key.split("."):
                        node = getattr(node, part)
                    values[key] = OmegaConf.to_container(node) if OmegaConf.is_config(node) else node
            return {"values": values}
        except Exception as e:
            return {"refused": f"{type(e).__name__}: {e}".splitlines()[0]}
        finally:
            GlobalHydra.instance().clear()
