"""What the report's figures share (``curves.py``, ``evalbars.py``): their size and fonts (read at a paper's
text width), a colour-blind-safe palette with one colour per configuration's name in every figure
(``Styles``), the panels' facets, and saving: a PNG (and its vector PDF when asked), atomically, drawn only
when its inputs changed (a content hash, ``.<name>.sha256``, beside it). Layout and colours: docs/REPORT.md,
"Figures".
"""

from __future__ import annotations

import functools
import hashlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from klsweep import store
from klsweep.report.names import KL_KEYS, fmt_value, kl_on, sort_key

if TYPE_CHECKING:
    import pandas as pd

    from klsweep.report.tables import Report

VECTOR_FORMAT = "pdf"
FONT = 8  # points: tick, legend and panel labels, read at a paper's text width (the figures are ~7.5 in wide)
WIDTH = 7.5  # inches: a two-column paper's text width, give or take; what a figure is drawn at
LINE_IN = 0.15  # inches per line of 8-pt text (legend rows, stacked facet labels)
CHAR_IN = 0.062  # inches per character of 8-pt text (DejaVu Sans, on average)
# Okabe & Ito's colour-blind-safe palette without black and yellow (too faint on white), then Paul Tol's muted
# one: distinct under the common colour-vision deficiencies
OKABE_ITO = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9")
TOL_MUTED = (
    "#332288",
    "#88CCEE",
    "#44AA99",
    "#117733",
    "#999933",
    "#DDCC77",
    "#CC6677",
    "#882255",
    "#AA4499",
)
LINESTYLES = ("-", "-.", ":")  # past the palette's colours: each colour again, with another line style
NO_KL_GREYS = ("#555555", "#999999", "#333333", "#bbbbbb")
FACET_ORDER = (
    "kl.placement",
    "offpolicy.lag",
    "model.name",
    "model.path",
    "task.name",
    "kl.level",
    "kl.importance",
    "offpolicy.num_iterations",
)
MAX_LINES = 4  # configurations in a panel before it is split by one more axis
MAX_PANELS = 12  # rows of panels at most


def figure(*args: Any, **kwargs: Any):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(*args, **kwargs)


def plain_text(draw: Callable[..., list[Path]]) -> Callable[..., list[Path]]:
    """``draw`` with every label plain text, as written: no mathtext ("$\\boxed{2}$" in a value is not
    parsed, nor does it fail the figure), no LaTeX."""

    @functools.wraps(draw)
    def plain(*args: Any, **kwargs: Any) -> list[Path]:
        import matplotlib

        with matplotlib.rc_context({"text.parse_math": False, "text.usetex": False}):
            return draw(*args, **kwargs)

    return plain


def margins(fig: Any, left: float, right: float, top: float, bottom: float, wgap: float, hgap: float) -> None:
    """A fixed layout (matplotlib's constrained layout costs a draw per save): margins and gaps in inches."""
    w, h = fig.get_size_inches()
    rows, cols = fig.axes[0].get_subplotspec().get_gridspec().get_geometry()
    axes_w = max((w - left - right - wgap * (cols - 1)) / cols, 0.1)
    axes_h = max((h - top - bottom - hgap * (rows - 1)) / rows, 0.1)
    fig.subplots_adjust(
        left=left / w,
        right=1 - right / w,
        top=1 - top / h,
        bottom=bottom / h,
        wspace=wgap / axes_w,
        hspace=hgap / axes_h,
    )


def digest(code: str, *parts: Any) -> str:
    """A content hash of a figure's inputs (frames by value, the rest by repr) and of the code that draws it
    (``code``: its module's file, with this one's)."""
    import pandas as pd

    h = hashlib.sha256(Path(__file__).read_bytes() + Path(code).read_bytes())
    for part in parts:
        if isinstance(part, pd.DataFrame):
            h.update(repr(list(part.columns)).encode())
            h.update(pd.util.hash_pandas_object(part, index=True).to_numpy().tobytes())
        else:
            h.update(repr(part).encode())
    return h.hexdigest()


def _stamp(path: Path) -> Path:
    return path.with_name(f".{path.name}.sha256")


def paths(path: Path, vector: bool) -> list[Path]:
    return [path, path.with_suffix(f".{VECTOR_FORMAT}")] if vector else [path]


def unchanged(path: Path, hashed: str, vector: bool) -> bool:
    """Whether the PNG at ``path`` (and its PDF, when ``vector``) were drawn from inputs with this hash."""
    stamp = _stamp(path)
    return (
        all(p.exists() for p in paths(path, vector))
        and stamp.exists()
        and stamp.read_text().strip() == hashed
    )


def save(fig: Any, path: Path, hashed: str, vector: bool, about: str = "") -> list[Path]:
    """The PNG and, when ``vector``, its vector copy (same name, ``.pdf``; else an older copy is removed, no
    longer what the PNG shows), then the hash of what they show. ``about``: what the figure shows and of which
    eval, in the files' metadata (PNG ``Description``, PDF ``Subject``): what its axes leave out."""
    import matplotlib.pyplot as plt

    pdf = path.with_suffix(f".{VECTOR_FORMAT}")
    _stamp(path).unlink(missing_ok=True)
    try:
        _savefig(fig, path, dpi=150, metadata={"Description": about} if about else None)
        if vector:
            with plt.rc_context({"pdf.fonttype": 42}):  # TrueType fonts: publishers refuse Type 3
                _savefig(fig, pdf, metadata={"Subject": about} if about else None)
        else:
            pdf.unlink(missing_ok=True)
    finally:
        plt.close(fig)
    store.atomic_write_text(_stamp(path), hashed + "\n")
    return paths(path, vector)


def _savefig(fig: Any, path: Path, **kwargs: Any) -> None:
    """``fig.savefig(path)`` atomically: into a file of this process beside it, then renamed over it (a full
    disk leaves the old figure, never a truncated one)."""
    tmp = path.with_name(f".{path.stem}.{os.getpid()}.tmp{path.suffix}")
    try:
        fig.savefig(tmp, **kwargs)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


# ------------------------------------------------------------------------------------------------ facets


def configs_frame(report: Report) -> pd.DataFrame:
    """One row per configuration: ``config``, its axis values and ``kl_on``."""
    first = report.runs.drop_duplicates("config").set_index("config", drop=False)
    configs = first[["config", *report.axes]].copy()
    configs["kl_on"] = kl_on(first)
    return configs


def facets(configs: pd.DataFrame, shown: list[str], bound: set[str] = frozenset()) -> list[str]:
    """The axes that split the curves into panels: from ``FACET_ORDER`` (then any other labelled axis but the
    estimator and beta, which are what a panel compares; none a label rule names with another axis:
    ``bound``), one at a time while a panel holds more than ``MAX_LINES`` configurations and the panels stay
    at most ``MAX_PANELS``."""
    candidates = [a for a in FACET_ORDER if a in shown]
    candidates += [a for a in shown if a not in candidates and a not in ("kl.estimator", "kl.beta")]
    candidates = [a for a in candidates if a not in bound]
    out: list[str] = []
    while _lines_per_panel(configs, out) > MAX_LINES:
        for a in candidates:
            if a not in out and len(panels(configs, [*out, a])) <= MAX_PANELS:
                out.append(a)
                break
        else:
            break
    return out


def panels(configs: pd.DataFrame, facet_axes: list[str]) -> list[tuple[Any, ...]]:
    """The panels: every combination of faceted values that some configuration with KL has (a run without KL
    has "no KL" for the KL fields: it belongs to every panel of its other values)."""
    on = configs[configs["kl_on"]] if configs["kl_on"].any() else configs
    keys = {tuple(fmt_value(v) for v in row) for row in on[facet_axes].itertuples(index=False)}
    return sorted(keys, key=sort_key)


def in_panel(configs: pd.DataFrame, facet_axes: list[str], panel: tuple[Any, ...]) -> pd.Series:
    import pandas as pd

    mask = pd.Series(True, index=configs.index)
    for a, v in zip(facet_axes, panel, strict=True):
        values = configs[a].map(fmt_value)
        wildcard = ~configs["kl_on"] if a in KL_KEYS else False
        mask &= (values == v) | wildcard
    return mask


def _lines_per_panel(configs: pd.DataFrame, facet_axes: list[str]) -> int:
    return max((int(in_panel(configs, facet_axes, p).sum()) for p in panels(configs, facet_axes)), default=0)


# ------------------------------------------------------------------------------------------------ colours


@dataclass
class Styles:
    """Which configurations share a line or bar style: those of one name over the axes a panel does not
    split by (``hues``): per name its style (``by_name``, in legend order: the configurations' order, no KL
    last), per configuration its name (``of``). The curves' legend and the eval bars' colours both come from
    it: a configuration has one colour in every figure."""

    facets: list[str]
    hues: list[str]
    of: dict[Any, str]
    by_name: dict[str, dict[str, Any]]


def styles(report: Report) -> Styles:
    """The report's ``Styles``: the facets of the curves, then one colour per name with KL (Okabe-Ito, then
    Tol's muted palette, then both again in other line styles), grey and dashed for the names without KL."""
    configs = configs_frame(report)
    names = report.names
    facet_axes = facets(configs, names.shown, names.bound())
    hues = [a for a in names.shown if a not in facet_axes]
    of = {c: names.name(c, hues, force_kl=True) for c in configs["config"]}
    with_kl = list(
        dict.fromkeys(of[c] for c, on in zip(configs["config"], configs["kl_on"], strict=True) if on)
    )
    without = list(
        dict.fromkeys(of[c] for c, on in zip(configs["config"], configs["kl_on"], strict=True) if not on)
    )
    palette = OKABE_ITO if len(with_kl) <= len(OKABE_ITO) else TOL_MUTED
    by_name: dict[str, dict[str, Any]] = {}
    for i, name in enumerate(with_kl):
        by_name[name] = {
            "color": palette[i % len(palette)],
            "ls": LINESTYLES[i // len(palette) % len(LINESTYLES)],
        }
    for i, name in enumerate(without):
        by_name.setdefault(name, {"color": NO_KL_GREYS[i % len(NO_KL_GREYS)], "ls": "--"})
    return Styles(facet_axes, hues, of, by_name)
