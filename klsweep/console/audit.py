"""``klsweep audit``'s tables: the exact-gradient audit and the GRPO audit, as rich tables, JSON or CSV."""

from __future__ import annotations

from typing import TYPE_CHECKING

from klsweep.audit import GRPO_VERDICTS

if TYPE_CHECKING:
    from rich.console import Console

    from klsweep.audit import AuditRow, GRPOAuditRow


VERDICT_STYLES = {
    "unbiased reverse KL": "green",
    "forward KL": "yellow",
    "zero in expectation": "magenta",
    "biased": "red",
}


def audit_tables(rows: list[AuditRow], title: str = "", width: int | None = None) -> list:
    """The rows as rich Tables, one per importance weighting (preset rows: one table, a ``preset`` column
    first), the verdict coloured. Errors are relative to the exact gradient of the reverse (``err rev``) and
    forward (``err fwd``) KL; ``|E g|`` is the expected gradient's norm relative to the reverse-KL gradient's.
    Preset rows also say what sets two rows of one estimator and placement apart (``preset_form``: weight,
    clamp, form), in their columns where a table that wide fits ``width`` (None: any width), else in a table
    of their own under the numbers; the level is a column only where the presets' differ."""
    from rich import box
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    off_policy = any(r.behavior_shift > 0 for r in rows)
    presets = any(r.preset for r in rows)
    forms = {r.preset: preset_form(r.preset) for r in rows} if presets else {}
    shown_forms = [i for i, name in enumerate(FORM_COLUMNS) if any(f[i] != "—" for f in forms.values())]
    level = not presets or len({r.level for r in rows}) > 1

    def table(title: str, importance: str, with_forms: bool, with_numbers: bool = True) -> Table:
        t = Table(title=title or None, box=box.SIMPLE_HEAD, padding=0, pad_edge=False)
        names = ("preset", "est", "placement") if presets else ("est", "placement")
        columns = [*names, *(["level"] if level else [])]
        for name in (*columns, *(FORM_COLUMNS[i] for i in shown_forms if with_forms)):
            t.add_column(name, no_wrap=True)
        if with_numbers:
            for name in ("err rev", "err fwd", "|E g|", "variance"):
                t.add_column(name, justify="right")
            t.add_column("verdict", no_wrap=True)
        for r in rows:
            if presets or r.importance == importance:
                values = (r.rel_err_reverse, r.rel_err_forward, r.rel_norm, r.grad_variance)
                first = (r.preset,) if presets else ()
                form = [forms[r.preset][i] for i in shown_forms] if with_forms else []
                numbers = (
                    [*(f"{x:.3f}" for x in values), Text(r.verdict, style=VERDICT_STYLES[r.verdict])]
                    if with_numbers
                    else []
                )
                t.add_row(*first, r.estimator, r.placement, *([r.level] if level else []), *form, *numbers)
        return t

    out = []
    for importance in ("",) if presets else dict.fromkeys(r.importance for r in rows):
        full_title = f"{title}, importance weights: {importance}" if off_policy and not presets else title
        if presets and not level:
            full_title += f", level {rows[0].level}"
        one = table(full_title, importance, with_forms=bool(shown_forms))
        if shown_forms and width is not None and Console(width=10_000).measure(one).maximum > width:
            out += [
                table(full_title, importance, with_forms=False),
                table("what sets the presets apart", importance, with_forms=True, with_numbers=False),
            ]
        else:
            out.append(one)
    if out:  # under the last table: what its columns are
        legend = [FORM_LEGEND[FORM_COLUMNS[i]] for i in shown_forms]
        out[-1].caption, out[-1].caption_justify = "\n".join([*legend, AUDIT_LEGEND]), "left"
    return out


FORM_COLUMNS = ("weight", "clamp", "form")
FORM_LEGEND = {
    "weight": "weight: the loss half's importance weight w (token: pi/mu per\n"
    "  token; self: pi/sg(pi), 1 with a gradient; seq mean: the\n"
    "  sequence's mean log-ratio; +grad: w keeps its gradient; <=c: capped).",
    "clamp": "clamp: d±c: the log-ratio d clamped before the estimator; k±c (w·k±c):\n"
    "  the estimate (times w) clamped; sg(w): w detached where d's clamp bites.",
    "form": "form: st: straight-through, the estimator's value with k2's gradient;\n"
    "  unbiased: sg(w k) grad log pi per token.",
}
IMPORTANCE_SHORT = {
    "none": "—",
    "token": "token",
    "sequence": "seq",
    "sequence_mean": "seq mean",
    "self": "self",
}


def preset_form(name: str) -> tuple[str, str, str]:
    """What a preset's KL sets beyond its estimator, placement and level, as the audit's ``weight``,
    ``clamp`` and ``form`` cells ("—": klsweep's default): the rows ``nemo k3 loss token`` and ``verl k3
    loss token``, or ``slime`` and ``slime-unbiased``, read the same without them."""
    from klsweep import presets

    kl = presets.kl_config(name)
    weight = IMPORTANCE_SHORT.get(kl.importance, kl.importance)
    if kl.importance != "none":
        weight += "+grad" if kl.importance_gradient else ""
        weight += f" <={kl.importance_cap:g}" if kl.importance_cap else ""
    clamps = [f"d±{kl.log_ratio_clamp:g}"] if kl.log_ratio_clamp else []
    if kl.value_clamp:
        clamps.append(f"{'w·k' if kl.clamp_weighted else 'k'}±{kl.value_clamp:g}")
    if kl.clamp_detaches_weight:
        clamps.append("sg(w)")
    form = "st" if kl.straight_through else "unbiased" if kl.unbiased_gradient else "—"
    return weight, " ".join(clamps) or "—", form


AUDIT_LEGEND = """\
err rev, err fwd: |E g - grad KL| / |grad KL|, the error of the
  expected gradient E g against the reverse KL(pi||ref) and the
  forward KL(ref||pi) gradient.
|E g|: the expected gradient's norm over the reverse-KL gradient's.
variance: the trace of the per-sample gradient's covariance."""


GRPO_VERDICT_STYLES = dict(zip(GRPO_VERDICTS, ("green", "cyan", "yellow", "magenta", "red"), strict=True))


GRPO_LEGEND = """\
scale: the effective KL gradient, (E[grad L(beta)] - E[grad L(0)]) / beta,
  projected on grad KL(pi||ref) over its squared norm, in units of the loss
  type's aggregation: 1 when beta means what it says.
cos rev, cos fwd: its cosines with grad KL(pi||ref) and grad KL(ref||pi).
err rev: its relative error against grad KL(pi||ref) (exact: below 1e-6;
  rescaled: the reverse-KL direction at another scale)."""


def grpo_audit_tables(rows: list[GRPOAuditRow]) -> list:
    """The rows as rich Tables, one per reward mode and reward scaling (off-policy: and per reward_logp and
    importance), narrow enough for 80 columns:
    ``scale`` is ``effective_scale``, ``cos rev``/``cos fwd`` the cosines with grad KL(pi||ref) and
    grad KL(ref||pi), ``err rev`` the relative error of effective / unit against grad KL(pi||ref)."""
    from rich import box
    from rich.table import Table
    from rich.text import Text

    out = []

    presets = any(r.preset for r in rows)

    def table_of(r: GRPOAuditRow) -> tuple[str, ...]:
        if presets:  # a framework's advantage estimator (klsweep.grpo.Advantage) where its file selects one
            return ("", f"advantage {r.advantage}" if r.advantage else f"scale_rewards {r.scale_rewards}")
        sampling = (r.reward_logp, r.importance) if r.behavior_shift > 0 else ()
        return (r.reward_mode, r.scale_rewards, *sampling)

    for key in dict.fromkeys(map(table_of, rows)):
        title = f"reward_mode {key[0]}, scale_rewards {key[1]}" if key[0] else key[1]
        if len(key) > 2:
            title += f",\nreward_logp {key[2]}, importance {key[3]}"
        t = Table(
            title=title,
            box=box.SIMPLE_HEAD,
            padding=0,
            pad_edge=False,
        )
        for name in ("preset", "est", "placement", "level") if presets else ("est", "placement", "level"):
            t.add_column(name, no_wrap=True)
        for name in ("scale", "cos rev", "cos fwd", "err rev"):
            t.add_column(name, justify="right", no_wrap=True)
        t.add_column("verdict", no_wrap=True)
        for r in rows:
            if table_of(r) == key:
                verdict = Text(r.verdict, style=GRPO_VERDICT_STYLES[r.verdict])
                numbers = (r.effective_scale, r.cos_reverse, r.cos_forward, r.rel_err_reverse)
                names = (r.preset,) if presets else ()
                t.add_row(*names, r.estimator, r.placement, r.level, *(f"{x:.3f}" for x in numbers), verdict)
        out.append(t)
    return out


def print_audit(
    console: Console, rows: list, fmt: str, vocab: int, length: int, seed: int, ref_distance: float
) -> None:
    """``klsweep audit``'s rows: ``json`` (a list) or ``csv`` on stdout, plain; else the rich tables under a
    heading that names the settings (the GRPO audit's with their legend); preset rows are followed by how each
    preset was proven to be its framework's code (``checked_lines``)."""
    from klsweep.audit import rows_as_dicts

    if fmt == "json":
        import json

        print(json.dumps(rows_as_dicts(rows), indent=2))
    elif fmt == "csv":
        _print_csv(rows_as_dicts(rows))
    else:
        _print_tables(console, rows, vocab, length, seed, ref_distance)
        if any(r.preset for r in rows):
            console.print(checked_lines([r.preset for r in rows]), markup=False, highlight=False)


def _print_csv(dicts: list[dict]) -> None:
    import csv
    import sys

    if dicts:
        writer = csv.DictWriter(sys.stdout, fieldnames=list(dicts[0]), lineterminator="\n")
        writer.writeheader()
        writer.writerows(dicts)


def checked_lines(names: list[str]) -> str:
    """Per preset audited, how it was proven to be its framework's code (klsweep.presets.SOURCES): executed,
    transcribed or klsweep's own, wrapped at 80 columns."""
    import textwrap

    from klsweep import presets

    known = [n for n in dict.fromkeys(names) if n in presets.SOURCES]
    lines = ["proven against each framework's code (tests/peer in a clone; klsweep docs KL):"]
    for how in presets.CHECKED:
        group = [n for n in known if presets.checked(n) == how]
        if group:
            lines += textwrap.wrap(
                ", ".join(group), 78, initial_indent=f"  {how + ':':13}", subsequent_indent=" " * 15
            )
    return "\n".join(lines)


def print_framework_audit(
    console: Console, err: Console, found: dict, rows: list, fmt: str, framework: str, path: str
) -> None:
    """``klsweep audit --framework``: ``json``, the object ``{"kl", "warnings", "audit"}``; ``csv``, the audit
    rows (the warnings on ``err``); else the klsweep keys the config maps to, its warnings and the audit's
    tables."""
    from klsweep.audit import rows_as_dicts
    from klsweep.audit.frameworks import VERSIONS
    from klsweep.console.terminal import print_warning

    if fmt == "json":
        import json

        print(json.dumps(found | {"audit": rows_as_dicts(rows)}, indent=2))
        return
    warnings = found["warnings"]
    if fmt == "csv":
        _print_csv(rows_as_dicts(rows))
        for line in warnings:
            print_warning(err, line)
        return
    terms = found["kl"] if found["kl"] and "estimator" not in found["kl"] else {"": found["kl"]}
    console.print(f"{path}, as {VERSIONS[framework]} reads it:", markup=False, highlight=False)
    import textwrap

    for place, keys in terms.items():
        if keys:
            shown = " ".join(f"kl.{k}={v}" for k, v in keys.items() if _shown(k, v))
            head = f"  {place}: " if place else "  "
            text = textwrap.fill(shown, 78, initial_indent=head, subsequent_indent=" " * len(head))
            console.print(text, markup=False, highlight=False)
    for line in warnings:
        print_warning(err, line)
    if rows:
        r = rows[0]
        length = getattr(r, "length", None)
        _print_tables(console, rows, 3, length or (2 if hasattr(r, "effective_scale") else 3), 0, 1.0)


def _shown(key: str, value: object) -> bool:
    """A klsweep key worth printing: the estimator, placement, level and beta, and every other off its default."""
    from klsweep.config import KLSection

    return key in ("estimator", "placement", "level", "beta") or getattr(KLSection(), key) != value


def setup_line(vocab: int, length: int, ref_distance: float) -> str:
    """What the audit header's V, L and ref distance are, in one line."""
    return (
        f"V={vocab}: a tabular policy over {vocab} tokens; L={length}: completions of {length} tokens, all "
        f"{vocab**length} enumerated (exact, no sampling); ref distance {ref_distance:g}: the reference's logits "
        f"are the policy's + {ref_distance:g} x standard normal noise (--vocab, --length, --ref-distance)"
    )


def _print_setup(console: Console, vocab: int, length: int, ref_distance: float) -> None:
    """``setup_line`` wrapped at the console's prose width (80 on a pipe)."""
    import textwrap

    from klsweep.console.terminal import prose_width

    for part in textwrap.wrap(setup_line(vocab, length, ref_distance), prose_width(console)):
        console.print(part, markup=False, highlight=False, soft_wrap=True)


def _print_tables(
    console: Console, rows: list, vocab: int, length: int, seed: int, ref_distance: float
) -> None:
    from klsweep.audit import GRPOAuditRow

    if isinstance(rows[0], GRPOAuditRow):
        r = rows[0]
        off = (
            f"off-policy (behaviour shift {r.behavior_shift:g})\n" if r.behavior_shift > 0 else "on-policy: "
        )
        console.print(
            f"GRPO audit, {off}V={vocab}, L={length}, G={r.group_size}, {r.loss_type}, beta {r.beta:g},"
            f" seed {seed}, ref distance {ref_distance:g}",
            markup=False,
        )
        _print_setup(console, vocab, length, ref_distance)
        console.print(*grpo_audit_tables(rows))
        console.print(GRPO_LEGEND, markup=False, highlight=False)
    else:
        shift = rows[0].behavior_shift
        policy = "on-policy" if shift == 0 else f"off-policy, behaviour shift {shift}"
        title = (
            f"KL gradient audit: V={vocab}, L={length}, seed={seed}, ref distance {ref_distance}, {policy}"
        )
        _print_setup(console, vocab, length, ref_distance)
        console.print(*audit_tables(rows, title=title, width=console.width))
