"""``config.load_run``'s fast path (a config.yaml of exactly the schema's shape, read without OmegaConf) gives
what OmegaConf's merge gives, and leaves everything else to OmegaConf: converted, filled in, or refused."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from klsweep import config as config_mod
from klsweep import grid, store
from klsweep.config import runfile

REPO = Path(__file__).resolve().parents[2]


def _omegaconf(data: dict) -> config_mod.RunConfig:
    """What load_run gave before its fast path: OmegaConf's merge over the schema."""
    loaded = OmegaConf.create(data)
    for dotted, value in config_mod.LEGACY_VALUES.items():
        if OmegaConf.select(loaded, dotted, default=None) is None:
            OmegaConf.update(loaded, dotted, value, force_add=True)
    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(config_mod.RunConfig), loaded))


def _write(tmp_path: Path, data: dict, name: str = "run") -> Path:
    d = tmp_path / name
    d.mkdir()
    (d / store.CONFIG_FILE).write_text(config_mod.run_file_text(data))
    return d


@pytest.fixture(scope="module")
def shipped_runs(tmp_path_factory) -> list[dict]:
    """Every 7th run of each shipped sweep (sweeps/*.yaml): every model, task, suite and cluster they name."""
    out = tmp_path_factory.mktemp("plans")
    runs = []
    for path in sorted((REPO / "sweeps").glob("*.yaml")):
        runs += [r.config for r in grid.load_plan(path, out=out / path.stem).runs][::7]
    return runs


def test_shipped_runs_read_as_omegaconf_reads_them(tmp_path, shipped_runs):
    assert len(shipped_runs) > 50
    for i, config in enumerate(shipped_runs):
        d = _write(tmp_path, config, f"r{i}")
        data = config_mod.read_run_file(d)
        assert runfile._exact(config_mod.RunConfig, data) is not runfile._NOT_EXACT  # the fast path
        assert config_mod.load_run(d) == _omegaconf(data)


@pytest.mark.parametrize(
    ("change", "fast"),
    [
        (lambda c: c["kl"].update(beta=1), True),  # an int for a float: read as 1.0, as OmegaConf does
        (lambda c: c["train"].update(steps="12"), False),  # a string for an int: OmegaConf converts it
        (lambda c: c["kl"].pop("reward_logp"), False),  # a key the folder predates: its legacy value
        (lambda c: c.pop("offpolicy"), False),  # a section left out (hand-written): its defaults
        (lambda c: c["task"].update(system_prompt=None), True),  # null where null is allowed
        (lambda c: c["train"]["trl"].update(beta=0.5), True),  # an open mapping
        (lambda c: c["wandb"].update(project="${name}"), False),  # an interpolation: OmegaConf resolves it
    ],
)
def test_changed_configs_read_as_omegaconf_reads_them(tmp_path, shipped_runs, change, fast):
    config = copy.deepcopy(shipped_runs[0])
    change(config)
    d = _write(tmp_path, config)
    data = config_mod.read_run_file(d)
    assert (runfile._exact(config_mod.RunConfig, data) is not runfile._NOT_EXACT) == fast
    assert config_mod.load_run(d) == _omegaconf(data)


@pytest.mark.parametrize(
    "change",
    [
        lambda c: c["train"].update(steps="many"),  # not an int
        lambda c: c["train"].update(steps=None),  # null where null is not allowed
        lambda c: c["kl"].update(beta=[1, 2]),  # a list for a float
        lambda c: c["kl"].update(unknown_key=1),  # a key the schema does not have
        lambda c: c["eval"].update(in_domain="math500"),  # a string for a list
    ],
)
def test_configs_omegaconf_refuses_are_refused(tmp_path, shipped_runs, change):
    config = copy.deepcopy(shipped_runs[0])
    change(config)
    d = _write(tmp_path, config)
    assert runfile._exact(config_mod.RunConfig, config_mod.read_run_file(d)) is runfile._NOT_EXACT
    with pytest.raises(store.UnreadableFile):
        config_mod.load_run(d)
