"""The peer tier, transcribed: the KL code of the frameworks that publish no package at the commit their preset
cites, copied verbatim below (each block names its file, lines and commit) and executed as it is, beside the
preset (tests/peer/peers.py: float64, log-ratios to +-40, random masks, on- and off-policy, value and gradient
of the whole term, beta included, within 1e-6). nemo-rl on PyPI is a placeholder, the PyPI package named slime
is another project, PipelineRL is not on PyPI.

Which lines each preset follows:
- nemo, nemo-onpolicy: NVIDIA-NeMo/RL 7ea279a, nemo_rl/algorithms/utils.py:42-101 (``calculate_kl``) and
  nemo_rl/algorithms/loss/loss_functions.py:482-503 (the KL block of ``ClippedPGLossFn``: the weight, then
  ``reference_policy_kl_penalty * calculate_kl(...)``), with ``ClippedPGLossConfig``'s values (:128-133, :153).
- slime, slime-unbiased: THUDM/slime 624b824, slime/utils/ppo_utils.py:12-51 (``compute_approx_kl``) and
  slime/backends/megatron_utils/loss.py:1117-1127 (the KL loss block of ``policy_loss_function``).
- pipelinerl: ServiceNow/PipelineRL 58d3934, pipelinerl/finetune/rl/__init__.py:119-133
  (``linear_decay_coef``), :259, :262 and :280-293 (``rl_step``'s log-ratios, ``approx_kl`` and ``kl_coef``; the
  loss adds ``kl_coef * approx_kl``: :359, :365), with conf/finetune/base.yaml's clamp 5 and
  pipelinerl/finetune_loop.py:768-772 (``rl_step(..., training_metrics.completed_steps, final_train_steps)``).
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
import torch
from peers import assert_same, inputs, load, masked_sum, run_block, value_and_gradient

from klsweep import kl, presets

pytestmark = pytest.mark.peer

# --- the frameworks' lines, verbatim -------------------------------------------------------------------------

# NVIDIA-NeMo/RL 7ea279a nemo_rl/algorithms/utils.py:42-101
# NVIDIA-NeMo/RL 7ea279a nemo_rl/algorithms/loss/loss_functions.py:482-503
# THUDM/slime 624b824 slime/utils/ppo_utils.py:12-51
# THUDM/slime 624b824 slime/backends/megatron_utils/loss.py:1117-1127
# ServiceNow/PipelineRL 58d3934 pipelinerl/finetune/rl/__init__.py:119-133
# ServiceNow/PipelineRL 58d3934 pipelinerl/finetune/rl/__init__.py:259, 262
# ServiceNow/PipelineRL 58d3934 pipelinerl/finetune/rl/__init__.py:280-293

NEMO_CALCULATE_KL = '''\
def calculate_kl(
    logprobs: torch.Tensor,
    logprobs_reference: torch.Tensor,
    kl_type: str = "k3",
    input_clamp_value: float | None = 20.0,
    output_clamp_value: float | None = 10.0,
    importance_sampling_weights: torch.Tensor | None = None,
) -> torch.Tensor:
    """Calculates a per-token estimate of the KL Divergence between two logprobs.

    From Schulman 2020, http://joschu.net/blog/kl-approx.html.

    Args:
        logprobs: torch.Tensor (b, s)
        logprobs_reference: torch.Tensor (b, s)
        kl_type: Type of KL approximation to use. Valid values: "k1", "k2", "k3".
        input_clamp_value: Optional clamping value for logr to prevent numerical instability.
                           If None, no clamping is applied.
        output_clamp_value: Optional clamping value for kl to prevent numerical instability.
                           If None, no clamping is applied.
        importance_sampling_weights: Optional per-token importance weights. When
                                     provided, weights are multiplied into the KL
                                     before output clamping. If input clamping
                                     applies to a token, the corresponding weight
                                     is detached so the clamp suppresses both KL
                                     and sampling-weight gradients.

    Returns:
        torch.Tensor: Per-token KL penalty values (b, s)
    """
    logr = logprobs_reference - logprobs
    if input_clamp_value is not None:
        logr_clamped = logr.clamp(min=-input_clamp_value, max=input_clamp_value)
        if importance_sampling_weights is not None:
            importance_sampling_weights = torch.where(
                logr == logr_clamped,
                importance_sampling_weights,
                importance_sampling_weights.detach(),
            )
        logr = logr_clamped

    if kl_type == "k1":
        kl = -logr

    elif kl_type == "k2":
        kl = torch.square(logr) / 2

    elif kl_type == "k3":
        kl = torch.exp(logr) - 1 - logr

    else:
        raise ValueError(f"Invalid KL type: {kl_type}")

    if importance_sampling_weights is not None:
        kl = importance_sampling_weights * kl

    if output_clamp_value is not None:
        kl = kl.clamp(min=-output_clamp_value, max=output_clamp_value)

    return kl
'''

NEMO_KL_BLOCK = """\
            if self.use_on_policy_kl_approximation:
                # See: docs/guides/grpo.md#on-policy-kl-approximation
                kl_importance_weights = torch.exp(
                    curr_logprobs_unfiltered - generation_logprobs
                )
            else:
                kl_importance_weights = torch.exp(
                    curr_logprobs_unfiltered - curr_logprobs_unfiltered.detach()
                )
            kl_importance_weights = torch.nan_to_num(
                kl_importance_weights, nan=0.0, posinf=0.0, neginf=0.0
            )

            # Compute KL loss
            kl = self.reference_policy_kl_penalty * calculate_kl(
                logprobs=curr_logprobs_unfiltered,
                logprobs_reference=reference_policy_logprobs,
                kl_type=self.reference_policy_kl_type,
                input_clamp_value=self.kl_input_clamp_value,
                output_clamp_value=self.kl_output_clamp_value,
                importance_sampling_weights=kl_importance_weights,
            )
"""

SLIME_COMPUTE_APPROX_KL = '''\
def compute_approx_kl(
    log_probs: torch.Tensor,
    log_probs_base: torch.Tensor,
    kl_loss_type: str,
    importance_ratio: torch.Tensor | None = None,
) -> torch.Tensor:
    """
    Compute the approximate KL divergence between two distributions.
    Schulman blog: http://joschu.net/blog/kl-approx.html

    Args:
        log_probs: Log probabilities of the new distribution.
        log_probs_base: Log probabilities of the base distribution.
        kl_loss_type: Type of KL estimator (k1, k2, k3, low_var_kl).
        importance_ratio: Optional IS ratio (π_θ/π_old) for unbiased KL estimation.
    """
    log_ratio = log_probs.float() - log_probs_base.float()

    if kl_loss_type == "k1":
        kl = log_ratio
    elif kl_loss_type == "k2":
        kl = log_ratio**2 / 2.0
    elif kl_loss_type in ["k3", "low_var_kl"]:
        # The non negative kl approximation in
        # http://joschu.net/blog/kl-approx.html
        # Besides non negative, it is also unbiased and have lower variance.
        log_ratio = -log_ratio
        kl = log_ratio.exp() - 1 - log_ratio
    else:
        raise ValueError(f"Unknown kl_loss_type: {kl_loss_type}")

    # Apply IS ratio for unbiased KL estimation (DeepSeek-V3.2)
    if importance_ratio is not None:
        kl = importance_ratio * kl

    # Clamp only for low_var_kl for numerical stability
    if kl_loss_type == "low_var_kl":
        kl = torch.clamp(kl, min=-10, max=10)

    return kl
'''

SLIME_KL_LOSS_BLOCK = """\
        ref_log_probs = batch["ref_log_probs"]
        ref_log_probs = torch.cat(ref_log_probs, dim=0)
        importance_ratio = None
        if args.use_unbiased_kl:
            importance_ratio = torch.exp(log_probs - old_log_probs)
        kl = compute_approx_kl(
            log_probs,
            ref_log_probs,
            kl_loss_type=args.kl_loss_type,
            importance_ratio=importance_ratio,
        )
"""

PIPELINERL_LINEAR_DECAY_COEF = '''\
def linear_decay_coef(current_step: int, max_step: int, initial_coef: float, final_coef: float) -> float:
    """
    Linearly decay the coefficient from initial to final value over the course of training.

    Args:
        current_step (int): Current step in the training
        max_step (int): Maximum number of steps in the training
        initial_coef (float): Initial coefficient value
        final_coef (float): Final coefficient value

    Returns:
        float: Linearly decayed coefficient value

    """
    return initial_coef + (final_coef - initial_coef) * current_step / max_step
'''

PIPELINERL_LOG_RATIOS = """\
    log_ratio_new_old = new_logprobs - old_logprobs
    log_ratio_ref_new = ref_logprobs - new_logprobs
"""

PIPELINERL_APPROX_KL = """\
    clamp_log_ratio_ref_new_indicators = torch.abs(log_ratio_ref_new) > config.clamp_log_ratio_ref_new_value

    log_ratio_ref_new_clamp = torch.clamp(
        log_ratio_ref_new,
        min=-config.clamp_log_ratio_ref_new_value,
        max=config.clamp_log_ratio_ref_new_value,
    )

    approx_kl = torch.exp(log_ratio_ref_new_clamp) - log_ratio_ref_new_clamp - 1  # Schulman KL approx
    approx_kl_new_old = torch.exp(log_ratio_new_old) - log_ratio_new_old - 1  # Schulman KL approx

    assert torch.isfinite(approx_kl).all(), f"approx_kl is not finite: {approx_kl}"
    entropy_bonus_coef = linear_decay_coef(current_step, max_step, config.entropy_bonus, config.final_entropy_bonus)
    kl_coef = linear_decay_coef(current_step, max_step, config.kl_coef, config.final_kl_coef)
"""


# --- the comparisons ---------------------------------------------------------------------------------------


def ours(name_or_config, x, beta: float | None = None):
    """klsweep's term: beta x ``kl.surrogate`` per sequence, value and gradient (the preset's own beta)."""
    config = presets.kl_config(name_or_config) if isinstance(name_or_config, str) else name_or_config
    beta = config.beta if beta is None else beta
    behavior = x.old if config.importance not in ("none", "self") else None
    return value_and_gradient(lambda lp: beta * kl.surrogate(lp, x.ref, x.mask, config, behavior), x)


def nemo_term(x, on_policy_kl_approximation: bool):
    """NeMo-RL's KL loss term per sequence (before its masked mean), with ClippedPGLossConfig's defaults."""
    calculate_kl = load(NEMO_CALCULATE_KL, ("calculate_kl",), "nemo_rl/algorithms/utils.py")["calculate_kl"]
    config = SimpleNamespace(
        use_on_policy_kl_approximation=on_policy_kl_approximation,
        reference_policy_kl_penalty=0.01,
        reference_policy_kl_type="k3",
        kl_input_clamp_value=20.0,
        kl_output_clamp_value=10.0,
    )

    def term(logp):
        scope = run_block(
            NEMO_KL_BLOCK, "nemo_rl/algorithms/loss/loss_functions.py", self=config, calculate_kl=calculate_kl,
            curr_logprobs_unfiltered=logp, generation_logprobs=x.old, reference_policy_logprobs=x.ref,
        )  # fmt: skip
        return masked_sum(scope["kl"], x.mask)

    return term


@pytest.mark.parametrize("off_policy", [False, True])
@pytest.mark.parametrize(("preset", "approximation"), [("nemo", False), ("nemo-onpolicy", True)])
def test_nemo_presets_are_nemo_rls_kl(preset, approximation, off_policy):
    x = inputs(off_policy)
    assert_same(ours(preset, x), value_and_gradient(nemo_term(x, approximation), x), preset)


def test_nemo_clamped_token_has_no_gradient():
    """The issue's cases: on-policy at a log-ratio of -3 (k3 = 10.1 > 10) NeMo-RL's term is 10 with gradient 0
    (klsweep's nemo preset gave 10 with gradient 10 before clamp_weighted); nemo-onpolicy at -2.5 with w = 2:
    value 10, gradient 0 (17.36 and -5 before); and past the log-ratio clamp (-25) no gradient either."""
    for preset, delta, weight in (("nemo", -3.0, 1.0), ("nemo-onpolicy", -2.5, 2.0), ("nemo", -25.0, 1.0)):
        logp = torch.zeros(1, 1, dtype=torch.float64)
        x = SimpleNamespace(
            logp=logp, ref=logp - delta, old=logp - torch.tensor(weight).log(), mask=torch.ones(1, 1).bool()
        )
        x.fresh = lambda: logp.clone().requires_grad_()  # noqa: B023
        config = presets.kl_config(preset)
        value, grad = ours(preset, x, beta=1.0)
        assert value.item() == pytest.approx(10.0) and grad.item() == 0.0, (preset, delta)
        # the same computation in the order klsweep had: clamp k3, then weigh (the weight's gradient kept)
        before = dataclasses.replace(config, clamp_weighted=False, clamp_detaches_weight=False)
        _, old_grad = ours(before, x, beta=1.0)
        assert old_grad.item() != 0.0, (preset, delta)


def slime_term(x, kl_loss_type: str, use_unbiased_kl: bool):
    """slime's KL loss term per sequence (before sum_of_sample_mean)."""
    compute = load(SLIME_COMPUTE_APPROX_KL, ("compute_approx_kl",), "slime/utils/ppo_utils.py")
    args = SimpleNamespace(use_kl_loss=True, use_unbiased_kl=use_unbiased_kl, kl_loss_type=kl_loss_type)

    def term(logp):
        scope = run_block(
            SLIME_KL_LOSS_BLOCK, "slime/backends/megatron_utils/loss.py", args=args,
            batch={"ref_log_probs": [x.ref]}, log_probs=logp, old_log_probs=x.old,
            compute_approx_kl=compute["compute_approx_kl"],
        )  # fmt: skip
        return masked_sum(scope["kl"], x.mask)

    return term


@pytest.mark.parametrize("off_policy", [False, True])
@pytest.mark.parametrize(("preset", "unbiased"), [("slime", False), ("slime-unbiased", True)])
def test_slime_presets_are_slimes_kl(preset, unbiased, off_policy):
    x = inputs(off_policy)
    beta = presets.kl_config(preset).beta
    theirs = value_and_gradient(lambda lp: beta * slime_term(x, "k1", unbiased)(lp), x)
    assert_same(ours(preset, x), theirs, preset)


@pytest.mark.parametrize("off_policy", [False, True])
@pytest.mark.parametrize("unbiased", [False, True])
@pytest.mark.parametrize("kl_loss_type", ["k1", "k2", "k3", "low_var_kl"])
def test_every_slime_kl_loss_type_has_a_klsweep_configuration(kl_loss_type, unbiased, off_policy):
    """slime's other types: k2, k3 and low_var_kl (k3 whose value, weighted or not, is clamped at +-10:
    clamp_weighted), with and without --use-unbiased-kl. Unclamped k3 to a log-ratio of 20 only: beyond, the
    weighted k3's gradient (w x log-ratio, a difference of terms of size w exp(40)) is below float64's
    precision, in slime's code and in klsweep's alike."""
    x = inputs(off_policy, span=20.0 if kl_loss_type == "k3" else 40.0)
    estimator = "k3" if kl_loss_type == "low_var_kl" else kl_loss_type
    clamp = {"value_clamp": 10.0, "clamp_weighted": True} if kl_loss_type == "low_var_kl" else {}
    weight = {"importance": "token", "importance_gradient": True} if unbiased else {}
    config = kl.KLConfig(estimator, "loss", beta=1.0, **clamp, **weight)
    assert_same(ours(config, x), value_and_gradient(slime_term(x, kl_loss_type, unbiased), x), kl_loss_type)


def pipelinerl_term(x, step: int, steps: int, kl_coef: float, final_kl_coef: float):
    """PipelineRL's KL loss term per sequence at optimiser step ``step`` (completed steps) of ``steps``."""
    decay = load(PIPELINERL_LINEAR_DECAY_COEF, ("linear_decay_coef",), "pipelinerl/finetune/rl/__init__.py")
    config = SimpleNamespace(
        clamp_log_ratio_ref_new_value=5,  # conf/finetune/base.yaml:111
        kl_coef=kl_coef,
        final_kl_coef=final_kl_coef,
        entropy_bonus=0.0,
        final_entropy_bonus=0.0,
    )

    def term(logp):
        names = dict(new_logprobs=logp, old_logprobs=x.old, ref_logprobs=x.ref, config=config)
        scope = run_block(PIPELINERL_LOG_RATIOS, "pipelinerl/finetune/rl/__init__.py", **names)
        scope = run_block(
            PIPELINERL_APPROX_KL, "pipelinerl/finetune/rl/__init__.py", **scope,
            current_step=step, max_step=steps, linear_decay_coef=decay["linear_decay_coef"],
        )  # fmt: skip
        return masked_sum(scope["kl_coef"] * scope["approx_kl"], x.mask)  # loss = ... - kl_coef * approx_kl

    return term


@pytest.mark.parametrize("off_policy", [False, True])
@pytest.mark.parametrize(("step", "steps"), [(0, 10), (9, 10), (1, 2), (999, 1000)])
def test_pipelinerl_preset_is_pipelinerls_kl_and_schedule(step, steps, off_policy):
    """The clamp 5 of every shipped config, and the decay over completed steps / max steps: at the last step
    (9 of 10) beta is 0.00019, not final_kl_coef 0.0001 (kl.beta_final_at: end)."""
    x = inputs(off_policy)
    config = dataclasses.replace(presets.kl_config("pipelinerl"), beta_final=0.0001)
    theirs = value_and_gradient(pipelinerl_term(x, step, steps, config.beta, 0.0001), x)
    assert_same(ours(config, x, beta=kl.beta_at(config, step, steps)), theirs, f"step {step} of {steps}")
    if (step, steps) == (9, 10):
        assert kl.beta_at(config, step, steps) == pytest.approx(0.00019)
