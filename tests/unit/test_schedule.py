"""Warm-up means what it says (issue 41): what transformers' learning-rate schedules make of the keys beside
``train.lr_scheduler_type`` (``klsweep.trlargs``' table, checked here against transformers' own
``get_scheduler``, as ``Trainer.create_scheduler`` calls it), and what ``klsweep plan`` refuses and shows."""

from __future__ import annotations

import pytest

from klsweep import trlargs
from klsweep.grid.validate import LR_SCHEDULERS

STEPS, WARMUP = 100, 10


def learning_rates(name: str, warmup: int, kwargs: dict | None) -> list[float]:
    """The learning rates (peak 1) transformers' schedule ``name`` gives the first 20 steps, as the trainer
    creates it (``Trainer.create_scheduler``: get_scheduler with the warm-up, the steps and the kwargs)."""
    import torch
    from transformers.optimization import get_scheduler

    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    scheduler = get_scheduler(
        name, optimizer, num_warmup_steps=warmup, num_training_steps=STEPS, scheduler_specific_kwargs=kwargs
    )
    rates = []
    for _ in range(20):
        rates.append(scheduler.get_last_lr()[0])
        optimizer.step()
        scheduler.step()
    return rates


def arguments(name: str) -> dict | None:
    """The arguments a schedule needs to start (``trlargs.NEEDS_KWARGS``), else none."""
    need = trlargs.NEEDS_KWARGS.get(name)
    return {need[0]: 10 if need[0] == "num_decay_steps" else 0.1} if need else None


@pytest.mark.parametrize("name", LR_SCHEDULERS)
def test_the_schedule_table_is_transformers(name):
    """NO_WARMUP: exactly the schedules whose first step is at the peak learning rate with a warm-up of 10
    steps (every other one rises to it over the warm-up); NO_KWARGS: exactly those that take an unknown argument without a word
    (every other one raises TypeError); NEEDS_KWARGS: exactly those that fail without arguments."""
    rates = learning_rates(name, WARMUP, arguments(name))
    assert (rates[0] == 1.0) == (name in trlargs.NO_WARMUP), rates
    if name not in trlargs.NO_WARMUP:  # a rise to the peak over the warm-up (from 0, or from a floor)
        assert rates[0] < rates[WARMUP // 2] < rates[WARMUP] == pytest.approx(1, abs=0.01), rates
    try:
        learning_rates(name, WARMUP, {**(arguments(name) or {}), "no_such_argument": 1})
        ignored = True
    except TypeError:
        ignored = False
    assert ignored == (name in trlargs.NO_KWARGS)
    try:
        learning_rates(name, WARMUP, None)
        starts = True
    except (TypeError, ValueError):
        starts = False
    assert starts == (name not in trlargs.NEEDS_KWARGS)
    assert set(trlargs.WITH_WARMUP) == set(trlargs.NO_WARMUP)
    for plain, warmed in trlargs.WITH_WARMUP.items():  # the same schedule after the warm-up
        assert learning_rates(warmed, WARMUP, None)[WARMUP:] == learning_rates(plain, 0, None)[WARMUP:]


def test_schedule_problems_refuse_what_would_do_nothing_or_not_start():
    def problems(**train):
        return trlargs.schedule_problems({"lr_scheduler_type": "constant", **train})

    assert problems() == [] and problems(warmup_steps=0, warmup_ratio=0.0) == []
    ((key, what, allowed),) = problems(warmup_steps=20)
    assert key == "train.warmup_steps" and "no warm-up" in what
    assert "train.lr_scheduler_type=constant_with_warmup" in allowed and "train.warmup_steps=0" in allowed
    ((key, _, allowed),) = problems(warmup_ratio=0.1)
    assert key == "train.warmup_ratio" and "train.warmup_ratio=0" in allowed
    assert problems(lr_scheduler_type="constant_with_warmup", warmup_steps=20) == []
    assert problems(lr_scheduler_type="linear", warmup_ratio=0.1) == []
    ((key, what, _),) = problems(
        lr_scheduler_type="constant_with_warmup", trl={"lr_scheduler_kwargs": {"x": 1}}
    )
    assert key == "train.trl.lr_scheduler_kwargs" and "takes no arguments" in what
    ((key, what, allowed),) = problems(lr_scheduler_type="cosine_with_min_lr")
    assert "min_lr or min_lr_rate" in what and allowed == "train.trl.lr_scheduler_kwargs={min_lr: ...}"
    assert (
        problems(lr_scheduler_type="cosine_with_min_lr", trl={"lr_scheduler_kwargs": {"min_lr_rate": 0.1}})
        == []
    )


def test_schedule_text_shows_the_warm_up():
    def text(**train):
        return trlargs.schedule_text({"learning_rate": 1e-4, "lr_scheduler_type": "constant", **train})

    assert text() == "1e-04 constant"
    assert text(lr_scheduler_type="constant_with_warmup", warmup_steps=30) == (
        "1e-04 constant_with_warmup (warm-up 30 steps)"
    )
    assert text(lr_scheduler_type="linear", warmup_ratio=0.125) == "1e-04 linear (warm-up 12.5% of the steps)"
    assert text(lr_scheduler_type="linear", warmup_steps=0) == "1e-04 linear"


def test_plan_refuses_a_warm_up_the_schedule_ignores_and_shows_one_it_keeps(tmp_path, monkeypatch, capsys):
    """The tiny model's own schedule is constant (klsweep/conf/model/tiny.yaml): a warm-up beside it did
    nothing (issue 41: runs with warm-up 20 and 50 logged the full learning rate from step 1); plan refuses it
    with the fix and writes nothing; with constant_with_warmup its lr column shows the warm-up."""
    from clitools import cli

    grid = tmp_path / "g.yaml"
    grid.write_text("name: g\nbase: {model: tiny, task: tiny, train.steps: 50}\ngrid: {seed: range(2)}\n")
    out = tmp_path / "out"
    code, _, err = cli(["plan", grid, "train.warmup_steps=20", "--out", out], monkeypatch, capsys)
    flat = " ".join(err.split())
    assert (
        code == 2
        and "train.warmup_steps: 20 with train.lr_scheduler_type constant, which has no warm-up" in flat
    )
    assert "train.lr_scheduler_type=constant_with_warmup" in flat and not out.exists()
    code, _, err = cli(["plan", grid, "train.warmup_ratio=0.1", "--out", out], monkeypatch, capsys)
    assert code == 2 and "train.warmup_ratio: 0.1 with" in " ".join(err.split())
    code, text, _ = cli(
        ["plan", grid, "train.lr_scheduler_type=constant_with_warmup", "train.warmup_steps=20", "--out", out],
        monkeypatch,
        capsys,
    )
    assert code == 0 and "3e-04 constant_with_warmup (warm-up 20 steps)" in text
    code, text, _ = cli(["plan", grid, "--out", out], monkeypatch, capsys)
    assert code == 0 and "3e-04 constant " in text and "warm-up" not in text
