"""A framework's own training config, read as its users write it, mapped onto klsweep's KL keys and audited
(``klsweep audit --framework NAME --config FILE``; docs/KL.md, "Auditing a framework's config").

``read(framework, path)`` reads the file (a YAML mapping, Hydra overrides ``key=value`` or a launch command's
``--flag value``, as the framework takes them), keeps the keys that touch the KL and maps them, at the version
the framework's preset cites (``VERSIONS``; the same code the peer tier executes: tests/peer/), onto one
``klsweep.kl.KLConfig`` per KL term: the reward's, the loss's, or one with placement ``both`` where the
framework adds the same estimate at the same coefficient to both. Beside them, plain warnings: the KL counted
twice (reward and loss), a coefficient the framework ignores for its algorithm (slime's ``--kl-coef`` under
GRPO, PipelineRL's under GSPO), a combination the framework itself refuses, a KL whose gradient is not the KL
it names (from the exact audit), TRL #6586, beta 0 ("no KL at all": said, not audited), and every key that
touches the KL but is not one the framework's version reads (named, never guessed).

``audit_config(...)`` runs the exact audit of the terms (``klsweep.audit``: the GRPO one where the framework's
algorithm is GRPO-like) and returns ``{"kl", "warnings", "audit"}``."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from klsweep.audit.frameworks import files
from klsweep.audit.frameworks.readers import FRAMEWORKS, MODULES, READERS, VERSIONS
from klsweep.audit.frameworks.reading import Reading, Terms, touches_kl
from klsweep.errors import Problem, UserError
from klsweep.kl import KLConfig

__all__ = ["FRAMEWORKS", "VERSIONS", "FrameworkKL", "audit_config", "gradient_warnings", "read", "read_terms"]


@dataclass(frozen=True)
class FrameworkKL:
    """What a framework's config trains as KL: its terms (label, klsweep configuration; none: no KL at all), the
    warnings, and whether its algorithm is GRPO-like (then the GRPO audit applies)."""

    framework: str
    terms: tuple[tuple[str, KLConfig], ...]
    warnings: tuple[str, ...]
    grpo: bool
    advantage: Any = (
        None  # the advantage estimator the file selects (klsweep.grpo.Advantage); None: TRL's GRPO
    )

    def kl(self) -> dict[str, Any]:
        """klsweep's keys: one term's, or per place (``reward``, ``loss``) when there are two; {} for none."""
        keys = {label.rsplit(" ", 1)[-1]: dataclasses.asdict(c) for label, c in self.terms}
        return next(iter(keys.values())) if len(keys) == 1 else keys


def read_terms(framework: str, path: Path | str) -> tuple[Reading, Terms]:
    """The file read by ``framework``'s reader: the ``Reading`` (its ``values``: every key read, as read) and the
    reader's terms; ``UserError`` where ``read`` refuses the file."""
    if framework not in READERS:
        raise UserError(
            Problem("--framework", f"{framework!r} is not a framework klsweep reads", ", ".join(FRAMEWORKS))
        )
    text = files.text_of(Path(path))
    other = getattr(MODULES[framework], "other_version", None)  # a file of another version, named: refused
    if other is not None and (problem := other(text)) is not None:
        raise UserError(problem, title=f"{path}: not a {VERSIONS[framework]} config")
    reader, kind = READERS[framework]
    compose = getattr(MODULES[framework], "compose", None)
    settings = files.settings(text, str(path), Path(path), compose) if kind == "yaml" else files.flags(text)
    if framework == "pipelinerl":  # a user's file sets finetune.rl.*; conf/finetune/base.yaml itself rl.*
        settings = {("finetune." + k if k.startswith("rl.") else k): v for k, v in settings.items()}
    if not settings:
        what = "a YAML mapping or Hydra overrides" if kind == "yaml" else "a launch command with --flags"
        raise UserError(Problem(str(path), f"no {framework} settings found", what))
    reading = Reading(framework, VERSIONS[framework], settings)
    found = reader(reading)
    if reading.problems:
        raise UserError(reading.problems, title=f"{path}: not a valid {VERSIONS[framework]} config")
    reading.unknown(touches_kl)
    return reading, found


def read(framework: str, path: Path | str) -> FrameworkKL:
    """The KL a framework's config trains (its terms as klsweep's keys) and the warnings; ``UserError`` for an
    unknown framework, a file that cannot be read, a value the framework would refuse."""
    reading, (terms, grpo) = read_terms(framework, path)
    if len(terms) == 2:
        reward, loss = terms[0][1], terms[1][1]
        same = dataclasses.replace(reward, placement="loss", reward_logp=loss.reward_logp) == loss
        if same:  # the same estimate at the same coefficient in both places: klsweep's placement both
            terms = [("both", dataclasses.replace(reward, placement="both"))]
        reading.warnings.insert(
            0,
            "the KL is counted twice: in the reward and in the loss"
            + ("" if same else " (two estimates: both terms audited)"),
        )
    if reading.no_reference is not None:
        reading.warnings.append(f"no KL against a reference: {reading.no_reference}; nothing to audit")
    elif not terms:
        reading.warnings.append(
            f"no KL at all (beta 0 or off, as {VERSIONS[framework]} reads this config): nothing to audit"
        )
    labelled = tuple((f"{framework} {label}", c) for label, c in terms)
    return FrameworkKL(framework, labelled, tuple(reading.warnings), grpo, reading.advantage)


def gradient_warnings(found: FrameworkKL) -> list[str]:
    """Per term whose expected gradient on-policy (the exact estimator audit) is not the reverse KL's: what it
    is instead."""
    from klsweep.audit.cache import cached_config_audit

    out = []
    for row in cached_config_audit(configs=list(found.terms)):
        if row.verdict != "unbiased reverse KL":
            out.append(
                f"{row.preset}: a KL whose gradient is not the KL it names: {row.estimator} in the {row.placement}"
                f" is {row.verdict} (err rev {row.rel_err_reverse:.3f}; docs/KL.md)"
            )
    return out


def audit_config(
    framework: str, path: Path | str, grpo: bool | None = None, **options: Any
) -> tuple[dict[str, Any], list[Any]]:
    """``read`` the config and audit its terms: the GRPO audit (``grpo_config_audit``) where the framework's
    algorithm is GRPO-like (or ``grpo``), else the estimator audit (``config_audit``), each kept on disk by
    configuration (``audit.cache``: a second audit of the same file needs no torch). ``options``: the audits'
    (vocab, length, seed, ref_distance, behavior_shift; group_size, groups, beta, scale_rewards, loss_type
    for the GRPO one). Returns ``{"kl", "warnings", "audit"}`` (the rows as dicts) and the rows."""
    from klsweep.audit.cache import cached_config_audit, cached_grpo_config_audit
    from klsweep.audit.exact import rows_as_dicts

    found = read(framework, path)
    warnings = [*found.warnings, *gradient_warnings(found)]
    rows: list[Any] = []
    if found.terms:
        use_grpo = found.grpo if grpo is None else grpo
        terms = list(found.terms)
        if use_grpo:
            beta = options.pop("beta", None)
            if beta is not None:
                terms = [(n, dataclasses.replace(c, beta=beta)) for n, c in terms]
            if (
                found.advantage is not None
            ):  # the advantage estimator the file selects (klsweep.grpo.Advantage)
                options["advantage"] = found.advantage
            rows = cached_grpo_config_audit(configs=terms, length=options.pop("length", None) or 2, **options)
        else:
            keep = {
                k: v for k, v in options.items() if k in ("vocab", "seed", "ref_distance", "behavior_shift")
            }
            rows = cached_config_audit(configs=terms, length=options.get("length") or 3, **keep)
    return {"kl": found.kl(), "warnings": warnings, "audit": rows_as_dicts(rows)}, rows
