"""`klsweep audit`: the exact gradient audit of KL configurations (klsweep/audit/)."""

from __future__ import annotations

from typing import Annotated

import typer

from klsweep.cli.app import app, terminal
from klsweep.errors import UserError


@app.command("audit")
def audit_command(
    vocab: Annotated[int, typer.Option(help="vocabulary size V of the tabular policy")] = 3,
    length: Annotated[
        int | None,
        typer.Option(help="completion length L (all V**L sequences are enumerated) [default: 3; --grpo: 2]"),
    ] = None,
    seed: Annotated[int, typer.Option(help="seed of the random policy, reference and behaviour policy")] = 0,
    ref_distance: Annotated[
        float, typer.Option(help="reference logits = policy logits + this x noise")
    ] = 1.0,
    behavior_shift: Annotated[
        float, typer.Option(help="> 0: off-policy, samples from logits + this x noise (a stale policy)")
    ] = 0.0,
    importance: Annotated[
        str | None,
        typer.Option(
            help="off-policy weighting pi/mu: none | token | sequence | all [default: none; --grpo "
            "off-policy: all]"
        ),
    ] = None,
    reward_logp: Annotated[
        str | None,
        typer.Option(help="--grpo off-policy: current | behavior | all [default: all]"),
    ] = None,
    importance_cap: Annotated[
        float | None, typer.Option(help="--grpo: cap of the importance weights, 0: none [default: 0]")
    ] = None,
    grpo: Annotated[
        bool,
        typer.Option(
            "--grpo",
            help="audit the trainer's whole GRPO objective (advantages, reward mode, loss aggregation): the "
            "effective KL gradient per unit beta",
        ),
    ] = False,
    group_size: Annotated[
        int | None, typer.Option(help="--grpo: completions per group G [default: 4]")
    ] = None,
    groups: Annotated[
        int | None, typer.Option(help="--grpo: groups per step, for --scale-rewards batch [default: 2]")
    ] = None,
    beta: Annotated[float | None, typer.Option(help="--grpo: the KL coefficient [default: 0.1]")] = None,
    scale_rewards: Annotated[
        str | None, typer.Option(help="--grpo: group | batch | none | all [default: group]")
    ] = None,
    reward_mode: Annotated[
        str | None, typer.Option(help="--grpo: separate | shaped | all [default: all]")
    ] = None,
    loss_type: Annotated[str | None, typer.Option(help="--grpo: a TRL loss type [default: dapo]")] = None,
    preset: Annotated[
        str | None,
        typer.Option(
            help="audit framework presets' whole KL configurations instead (klsweep/conf/preset/): NAME, "
            "NAME,NAME or all; with --grpo at the preset's beta unless --beta"
        ),
    ] = None,
    framework: Annotated[
        str | None,
        typer.Option(
            help="audit a framework's own training config instead (with --config): verl, trl, openrlhf, slime, "
            "nemo-rl, skyrl, areal, pipelinerl; the GRPO audit where its algorithm is GRPO-like"
        ),
    ] = None,
    config: Annotated[
        str | None,
        typer.Option(
            help="--framework's config file as its users write it: a YAML/JSON config, Hydra overrides or "
            "the launch command with its --flags"
        ),
    ] = None,
    estimator: Annotated[
        str | None, typer.Option(help="show only this estimator's rows: k1 | k2 | k3 | abs")
    ] = None,
    placement: Annotated[
        str | None, typer.Option(help="show only this placement's rows: reward | loss | both")
    ] = None,
    as_json: Annotated[
        bool,
        typer.Option(
            "--json", help='print the rows as a JSON list (--framework: {"kl", "warnings", "audit"})'
        ),
    ] = False,
    as_csv: Annotated[
        bool, typer.Option("--csv", help="print the rows as CSV (--framework: the warnings on stderr)")
    ] = False,
) -> None:
    """Exact bias and variance of every KL configuration's gradient, by enumerating a small tabular policy;
    with --grpo, the exact expected update of the trainer's whole GRPO objective; with --preset, of a
    framework's configuration; with --framework and --config, of a framework's own config file, with
    warnings (the KL counted twice, a coefficient the framework ignores, no KL at all).

    Columns: err rev / err fwd (rel_err_reverse, rel_err_forward): |E g - grad KL| / |grad KL| against the
    reverse KL(pi||ref) and forward KL(ref||pi) gradients; |E g| (rel_norm): the expected gradient's norm over
    the reverse-KL gradient's; variance: the trace of the per-sample gradient's covariance. --grpo: scale
    (effective_scale): the effective KL gradient per unit beta projected on grad KL(pi||ref), 1 when beta
    means what it says; cos rev / cos fwd: its cosines with the two KL gradients. docs/KL.md explains the
    verdicts."""
    try:
        _audit(**locals())
    except UserError as e:
        if not as_json:
            raise
        import json

        print(json.dumps({"error": str(e)}, indent=2))  # stdout: a --json reader gets JSON either way
        from klsweep.console import error_line

        terminal(stderr=True).print(error_line(e), highlight=False)
        raise typer.Exit(2) from e


def _audit(
    vocab, length, seed, ref_distance, behavior_shift, importance, reward_logp, importance_cap, grpo, group_size,
    groups, beta, scale_rewards, reward_mode, loss_type, preset, framework, config, estimator, placement, as_json,
    as_csv,
) -> None:  # fmt: skip
    """``audit_command``'s work (``UserError`` for bad input)."""
    from klsweep import audit, presets
    from klsweep.console import print_audit
    from klsweep.errors import Problem

    grpo_options = {
        "group_size": group_size,
        "groups": groups,
        "beta": beta,
        "scale_rewards": scale_rewards,
        "reward_mode": reward_mode,
        "loss_type": loss_type,
        "reward_logp": reward_logp,
        "importance_cap": importance_cap,
    }
    if grpo:
        grpo_options |= {"behavior_shift": behavior_shift, "importance": importance}
    given = {k: v for k, v in grpo_options.items() if v is not None}
    problems = []
    if as_json and as_csv:
        problems.append(Problem("--json, --csv", "both given", "at most one of them"))
    if given and not grpo:
        flags = ", ".join(f"--{k.replace('_', '-')}" for k in given)
        problems.append(Problem(flags, "given without --grpo", "add --grpo"))
    set_by_preset = {"importance": importance} | {
        k: given.get(k) for k in ("reward_mode", "reward_logp", "importance_cap")
    }
    for given_with, value in (("--preset", preset), ("--framework", framework)):
        if value is not None and any(v is not None for v in set_by_preset.values()):
            flags = ", ".join(f"--{k.replace('_', '-')}" for k, v in set_by_preset.items() if v is not None)
            problems.append(Problem(flags, f"given with {given_with}, which sets them", "leave them out"))
    if framework is not None and preset is not None:
        problems.append(Problem("--preset, --framework", "both given", "at most one of them"))
    if (framework is None) != (config is None):
        missing = "--config" if config is None else "--framework"
        problems.append(Problem(missing, "missing", "--framework NAME and --config FILE go together"))
    names = [n.strip() for n in preset.split(",")] if preset is not None else []
    for check in (lambda: audit.select([], estimator, placement), lambda: presets.resolve(names)):
        try:
            check()
        except UserError as e:
            problems.extend(e.problems)
    if problems:
        raise UserError(problems)
    fmt = "json" if as_json else "csv" if as_csv else "table"
    if framework is not None and config is not None:
        from klsweep.audit.frameworks import audit_config
        from klsweep.console import print_framework_audit

        keep = {
            k: v
            for k, v in given.items()
            if k in ("group_size", "groups", "beta", "scale_rewards", "loss_type")
        }
        options = {"vocab": vocab, "length": length, "seed": seed, "ref_distance": ref_distance}
        found, rows = audit_config(
            framework, config, grpo=True if grpo else None, behavior_shift=behavior_shift, **options, **keep
        )
        rows = audit.select(rows, estimator, placement)
        print_framework_audit(terminal(), terminal(stderr=True), found, rows, fmt, framework, config)
        return
    if preset is not None:
        keep = {
            k: given[k] for k in ("group_size", "groups", "beta", "scale_rewards", "loss_type") if k in given
        }
        if grpo:
            length = 2 if length is None else length
            rows = audit.grpo_preset_audit(
                names,
                vocab,
                length,
                seed=seed,
                ref_distance=ref_distance,
                behavior_shift=behavior_shift,
                **keep,
            )
        else:
            length = 3 if length is None else length
            rows = audit.preset_audit(names, vocab, length, seed, ref_distance, behavior_shift)
    elif grpo:
        length = 2 if length is None else length
        rows = audit.grpo_audit(vocab=vocab, length=length, seed=seed, ref_distance=ref_distance, **given)
    else:
        length = 3 if length is None else length
        importance = "none" if importance is None else importance
        rows = audit.audit(vocab, length, seed, ref_distance, behavior_shift, importance)
    rows = audit.select(rows, estimator, placement)
    if not rows:
        raise UserError(Problem("--estimator, --placement", "no audited row has them", "another filter"))
    print_audit(terminal(), rows, fmt, vocab, length, seed, ref_distance)
