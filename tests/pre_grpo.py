"""The trainer's code before klsweep/grpo.py existed (klsweep/trainer.py at 63aa8a5:
``KLGRPOTrainer._group_advantages`` and ``_aggregate``), kept verbatim as the reference that shaped mode and
the loss placement must reproduce bit for bit."""

from __future__ import annotations

import torch


def old_group_advantages(rewards, g, scale_rewards):
    from trl.trainer.utils import nanstd

    grouped = rewards.view(-1, g)
    mean = torch.nanmean(grouped, dim=1).repeat_interleave(g, dim=0)
    if scale_rewards in ("group", "none"):
        std = nanstd(grouped, dim=1).repeat_interleave(g, dim=0) if g > 1 else torch.zeros_like(rewards)
    elif scale_rewards == "batch":
        std = nanstd(rewards).expand_as(rewards) if rewards.numel() > 1 else torch.zeros_like(rewards)
    advantages = rewards - mean
    if scale_rewards != "none":
        advantages = advantages / (std + 1e-4)
    return torch.nan_to_num(advantages, nan=0.0)


def old_aggregate(per_token, mask, loss_type, accumulation, normalizer, max_completion_length):
    x = per_token * mask
    if loss_type in ("grpo", "sapo"):
        return (x.sum(-1) / mask.sum(-1).clamp(min=1.0)).mean() / accumulation
    if loss_type == "bnpo":
        return x.sum() / mask.sum().clamp(min=1.0) / accumulation
    if loss_type == "dr_grpo":
        return x.sum() / (x.size(0) * max_completion_length) / accumulation
    if loss_type in ("cispo", "dapo", "vespo"):
        return x.sum() / normalizer
    if loss_type == "luspo":
        return x.sum(-1).mean() / accumulation
    raise ValueError(loss_type)
