"""The peer tier, executed: the advantage estimators the frameworks' configs select (``klsweep.grpo.Advantage``,
what the GRPO audit of ``klsweep audit --framework`` models) against the frameworks' own advantage functions,
read out of their wheels (tests/peer/peers.py; the same pinned wheels as test_executed.py) and executed without
importing the packages: the task reward at the last completion token, the KL penalty per token subtracted
(``use_kl_in_reward``: verl's apply_kl_penalty, SkyRL's apply_reward_kl_penalty) or added after the task
reward's normalisation (OpenRLHF), float64, groups of 4, right-padded masks; every token's advantage within
1e-6."""

from __future__ import annotations

import types
from collections import defaultdict

import numpy as np
import pytest
import torch
from peers import RTOL, float_is_float64, load, run_block, wheel_source
from test_executed import WHEELS

from klsweep import grpo

pytestmark = pytest.mark.peer

GROUP, GROUPS, LENGTH, BETA = 4, 3, 7, 0.3


class _Any:
    """Any attribute: the registries' decorators and enums the advantage functions are defined under."""

    def __getattr__(self, name):
        return name


def _registered(*_args, **_kwargs):
    return lambda f: f


def batch(seed: int = 0):
    """Task rewards [N] (0/1 and a few fractions), per-token penalties [N, T] (either sign, as k1's), masks
    [N, T] (right-padded, each row at least two tokens); one group's rewards all equal (its std 0)."""
    g = torch.Generator().manual_seed(seed)
    n = GROUP * GROUPS
    reward = (torch.rand(n, generator=g, dtype=torch.float64) < 0.5).to(torch.float64)
    reward[GROUP : 2 * GROUP] = 1.0
    reward[-1] = 0.25
    penalty = torch.randn(n, LENGTH, generator=g, dtype=torch.float64)
    lengths = torch.randint(2, LENGTH + 1, (n,), generator=g)
    mask = torch.arange(LENGTH) < lengths[:, None]
    return reward, penalty * mask, mask


def token_level_rewards(reward, penalty, mask, beta=BETA):
    """verl's and SkyRL's per-token rewards with the KL in the reward: the score on the last completion token,
    less beta x the penalty of every token."""
    last = mask.cumsum(-1) == mask.sum(-1, keepdim=True)
    scores = torch.where(last & mask, reward[:, None], torch.zeros((), dtype=torch.float64))
    return scores - beta * penalty


def ours(spec, reward, penalty, mask, mode="shaped", beta=BETA):
    adv = grpo.advantage_of(spec, reward, penalty, mask, beta, GROUP, mode)
    return (adv.unsqueeze(-1) if adv.dim() == 1 else adv) * mask


def assert_close(a, b, what):
    assert a.shape == b.shape, (what, a.shape, b.shape)
    bad = (a - b).abs() > RTOL * b.abs().clamp(min=1)
    assert not bad.any(), f"{what}: differs at {bad.nonzero()[:4].tolist()}: {a[bad][:4]} vs {b[bad][:4]}"


INDEX = np.repeat(np.arange(GROUPS), GROUP)


# --- verl 0.9.1: verl/trainer/ppo/core_algos.py --------------------------------------------------------------


def verl_functions():
    core = wheel_source(WHEELS["verl"], "verl/trainer/ppo/core_algos.py")
    functional = wheel_source(WHEELS["verl"], "verl/utils/torch_functional.py")
    verl_f = load(
        functional, ("masked_sum", "masked_mean", "masked_var", "masked_whiten"), "torch_functional.py"
    )
    names = (
        "compute_grpo_outcome_advantage",
        "compute_rloo_outcome_advantage",
        "compute_reinforce_plus_plus_outcome_advantage",
        "compute_reinforce_plus_plus_baseline_outcome_advantage",
    )
    return load(
        core,
        names,
        "verl/trainer/ppo/core_algos.py",
        defaultdict=defaultdict,
        np=np,
        register_adv_est=_registered,
        AdvantageEstimator=_Any(),
        verl_F=types.SimpleNamespace(**{k: verl_f[k] for k in ("masked_whiten", "masked_mean")}),
    )


VERL_SPECS = {  # adv_estimator (norm_adv_by_std_in_grpo) -> what verl's reader selects
    "grpo": grpo.Advantage("group", "group", 1e-6),
    "grpo no std": grpo.Advantage("group", "none", 1e-6),
    "rloo": grpo.Advantage("leave_one_out", "none"),
    "reinforce_plus_plus": grpo.Advantage("none", "none", returns="token", whiten="unbiased"),
    "reinforce_plus_plus_baseline": grpo.Advantage("group", "none", whiten="unbiased"),
}


@pytest.mark.parametrize("selected", list(VERL_SPECS))
def test_verl_advantage_estimators(selected):
    """verl's estimator of ``algorithm.adv_estimator`` on token_level_rewards = scores - beta x KL
    (ray_trainer.py apply_kl_penalty, then compute_advantage), against ``grpo.advantage_of`` of the
    reader's spec with the KL shaped in."""
    fns = verl_functions()
    reward, penalty, mask = batch()
    rewards = token_level_rewards(reward, penalty, mask)
    m = mask.to(torch.float64)
    if selected.startswith("grpo"):
        theirs, _ = fns["compute_grpo_outcome_advantage"](
            rewards.clone(), m, INDEX, norm_adv_by_std_in_grpo=selected == "grpo"
        )
    elif selected == "reinforce_plus_plus":
        theirs, _ = fns["compute_reinforce_plus_plus_outcome_advantage"](
            rewards.clone(), m, config=types.SimpleNamespace(gamma=1.0)
        )
    else:
        theirs, _ = fns[f"compute_{selected}_outcome_advantage"](rewards.clone(), m, INDEX)
    assert_close(ours(VERL_SPECS[selected], reward, penalty, mask), theirs, f"verl {selected}")


def test_verl_reader_selects_these_specs(tmp_path):
    """verl's reader fills the spec the file selects (the specs above)."""
    from klsweep.audit.frameworks import read

    for selected, spec in VERL_SPECS.items():
        name = selected.split()[0]
        text = f"algorithm.adv_estimator={name}\nalgorithm.use_kl_in_reward=true\n"
        if selected == "grpo no std":
            text += "algorithm.norm_adv_by_std_in_grpo=false\n"
        path = tmp_path / f"{name}.txt"
        path.write_text(text)
        assert read("verl", path).advantage == spec, selected


# --- SkyRL (skyrl 0.4.0): skyrl/backends/skyrl_train/utils/ppo_utils.py --------------------------------------


SKYRL_SPECS = {
    "grpo": grpo.Advantage("group", "group", 1e-6),
    "grpo no std": grpo.Advantage("group", "none", 1e-6),
    "rloo": grpo.Advantage("leave_one_out", "none"),
    "reinforce++": grpo.Advantage("none", "none", returns="token", whiten="unbiased"),
}


@pytest.mark.parametrize("selected", list(SKYRL_SPECS))
def test_skyrl_advantage_estimators(selected, monkeypatch):
    """SkyRL's estimator of ``trainer.algorithm.advantage_estimator`` on the per-token rewards less
    beta x KL (trainer.py apply_reward_kl_penalty before compute_advantages_and_returns). (Its RLOO imports
    loguru for a warning on a group of one: a stand-in logger here.)"""
    import sys

    monkeypatch.setitem(sys.modules, "loguru", types.SimpleNamespace(logger=types.SimpleNamespace()))
    source = wheel_source(WHEELS["skyrl"], "skyrl/backends/skyrl_train/utils/ppo_utils.py")
    names = (
        "masked_var",
        "masked_whiten",
        "compute_grpo_outcome_advantage",
        "compute_rloo_outcome_advantage",
        "compute_reinforce_plus_plus_outcome_advantage",
    )
    helpers = wheel_source(WHEELS["skyrl"], "skyrl/backends/skyrl_train/utils/torch_utils.py")
    masked_mean = load(helpers, ("masked_mean",), "torch_utils.py")["masked_mean"]
    fns = load(
        source,
        names,
        "ppo_utils.py",
        defaultdict=defaultdict,
        np=np,
        masked_mean=masked_mean,
        register_advantage_estimator=_registered,
        AdvantageEstimator=_Any(),
    )
    reward, penalty, mask = batch(1)
    rewards = token_level_rewards(reward, penalty, mask)
    m = mask.to(torch.float64)
    if selected.startswith("grpo"):
        theirs, _ = fns["compute_grpo_outcome_advantage"](
            rewards.clone(), m, INDEX, grpo_norm_by_std=selected == "grpo"
        )
    elif selected == "rloo":
        theirs, _ = fns["compute_rloo_outcome_advantage"](rewards.clone(), m, INDEX)
    else:
        theirs, _ = fns["compute_reinforce_plus_plus_outcome_advantage"](rewards.clone(), m, gamma=1.0)
    assert_close(ours(SKYRL_SPECS[selected], reward, penalty, mask), theirs, f"skyrl {selected}")


# --- OpenRLHF 0.11.2: openrlhf/trainer/ppo_utils/experience_maker.py -----------------------------------------


OPENRLHF_SPECS = {
    "group_norm": grpo.Advantage("group", "group", 1e-9, returns="token"),
    "dr_grpo": grpo.Advantage("group", "none", returns="token"),
    "rloo": grpo.Advantage("leave_one_out", "none", returns="token"),
    "reinforce_baseline": grpo.Advantage("group", "none", returns="token", whiten="biased"),
    "reinforce": grpo.Advantage("none", "none", returns="token", whiten="biased"),
}


@pytest.mark.parametrize("selected", list(OPENRLHF_SPECS))
def test_openrlhf_advantage_estimators(selected):
    """OpenRLHF's ``compute_advantages_and_returns`` for ``--algo.advantage.estimator``: its baseline block,
    ``compute_reward`` (the KL per token, beta x, added after the task reward's normalisation, the reward on
    the last token) and ``get_cumulative_returns``, then its whitening block, executed from the wheel's lines
    (found by their text, not by number); against the reader's spec with the KL separate."""
    path = "openrlhf/trainer/ppo_utils/experience_maker.py"
    source = wheel_source(WHEELS["openrlhf"], path)
    utils = wheel_source(WHEELS["openrlhf"], "openrlhf/models/utils.py")
    compute_reward = load(utils, ("compute_reward",), "openrlhf/models/utils.py")["compute_reward"]
    lines = source.splitlines()

    def block(first: str, last: str) -> str:
        start = next(i for i, line in enumerate(lines) if first in line)
        end = next(i for i in range(start, len(lines)) if last in lines[i])
        return "\n".join(lines[start : end + 1]) + "\n"

    baseline = block('if args.algo.advantage.estimator == "rloo":', "rewards = rewards - rewards.mean()")
    whiten = block("if args.algo.advantage.estimator in [\"gae\", \"reinforce\", \"reinforce_baseline\"]:",
                   "exp.advantages = (exp.advantages - mean) * rstd")  # fmt: skip
    cumulative = _method(source, "get_cumulative_returns")
    reward, penalty, mask = batch(2)
    args = types.SimpleNamespace(
        algo=types.SimpleNamespace(
            advantage=types.SimpleNamespace(estimator=selected, no_std_norm=False, gamma=1.0)
        ),
        rollout=types.SimpleNamespace(n_samples_per_prompt=GROUP),
    )
    shaped = run_block(baseline, path, args=args, rewards=reward.reshape(-1, GROUP).clone())["rewards"]
    per_token = compute_reward(shaped.reshape(-1), BETA, penalty, action_mask=mask)
    experience = types.SimpleNamespace(advantages=cumulative(None, per_token, mask, 1.0), action_mask=mask)
    with float_is_float64():  # its .float() on the advantages: the comparison is in float64
        run_block(whiten, path, args=args, experiences=[experience])
    theirs = experience.advantages * mask
    assert_close(ours(OPENRLHF_SPECS[selected], reward, penalty, mask, "separate"), theirs, selected)


def _method(source: str, name: str):
    """A method of a class in ``source`` (found by name at any depth), as a plain function of (self, ...)."""
    import ast
    import textwrap

    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == name:
            node.decorator_list = []
            code = textwrap.dedent(ast.unparse(node))
            scope = {"torch": torch}
            exec(compile(code, name, "exec"), scope)  # noqa: S102 (the framework's own method)
            return scope[name]
    raise LookupError(name)
