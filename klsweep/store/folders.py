"""Sweep and run folders: a sweep's runs, a sweep named or given as a path, rehearsals refused, a folder
that is not one or cannot be written, the cache folder, and links out of the results folder."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from klsweep.errors import Problem, UserError
from klsweep.store.layout import BASELINE_DIR, CONFIG_FILE, REHEARSAL_MARKER, REPORT_DIR


def run_dirs(sweep_dir: str | os.PathLike) -> list[Path]:
    """The run folders of a sweep: every child holding a config.yaml, except baseline/ and report/."""
    d = Path(sweep_dir)
    if not d.exists():
        return []
    return sorted(
        p
        for p in d.iterdir()
        if p.is_dir() and p.name not in (BASELINE_DIR, REPORT_DIR) and (p / CONFIG_FILE).exists()
    )


def sweep_runs(sweep_dir: str | os.PathLike) -> list[Path]:
    """The run folders of a sweep (``run_dirs``); ``UserError`` when it has none: the folder is not a sweep's
    (``klsweep status /``), or nothing was launched in it."""
    dirs = run_dirs(sweep_dir)
    if not dirs:
        raise UserError(
            Problem(
                str(sweep_dir),
                "has no runs (no sub-folder with a config.yaml)",
                "a sweep folder: plan and launch it with `klsweep run`",
            ),
            title="no runs",
        )
    return dirs


def _grid_name(path: Path) -> str | None:
    """The ``name:`` of a grid file, or None when it cannot be read as one."""
    import yaml

    try:
        data = yaml.safe_load(path.read_text()[:1_000_000])
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None
    name = data.get("name") if isinstance(data, dict) else None
    return name if isinstance(name, str) else None


def resolve_sweep(
    sweep: str | os.PathLike, results_root: str | os.PathLike = "results", *, rehearsal: bool = False
) -> Path:
    """A sweep folder, or the name of one under ``results_root``; UserError if neither exists, or when it is a
    rehearsal's (``refuse_rehearsal``) unless ``rehearsal``."""
    p, q = Path(sweep), Path(results_root) / str(sweep)
    for candidate in (p, q):
        if candidate.is_dir():
            if not rehearsal:
                refuse_rehearsal(candidate)
            return candidate
    root = Path(results_root)
    known = sweep_names(root)
    if p.is_file() and p.suffix in (".yaml", ".yml"):
        name = _grid_name(p)
        use = f"the sweep name {name}" if name else "its sweep's name (its name: key)"
        raise UserError(
            Problem(
                str(sweep), f"that is a grid file: use {use}", ", ".join(known) or "a sweep folder's name"
            ),
            title="not a sweep",
        )
    raise UserError(
        Problem(
            str(sweep),
            f"no such sweep folder: no run of it was launched here (neither {p} nor {q} exists)",
            ", ".join(known) if known else "a sweep folder made by `klsweep run GRID` (its name: key)",
        ),
        title="no such sweep",
    )


def sweep_names(root: str | os.PathLike) -> list[str]:
    """The sweep folders under a results root, by name: neither hidden (``.rehearsal``, where `klsweep rehearse`
    writes) nor a rehearsal's."""
    root = Path(root)
    if not root.is_dir():
        return []
    return sorted(
        d.name for d in root.iterdir() if d.is_dir() and not d.name.startswith(".") and not rehearsals_in(d)
    )


def rehearsals_in(folder: str | os.PathLike) -> list[Path]:
    """The folders that ``klsweep rehearse`` marked (``REHEARSAL_MARKER``) among ``folder`` (a sweep or a run
    folder), the folder it is in, and its run folders."""
    folder = Path(folder)
    near = [folder, folder.parent, *run_dirs(folder)] if folder.is_dir() else [folder.parent]
    return [p for p in near if (p / REHEARSAL_MARKER).is_file()]


def refuse_rehearsal(folder: str | os.PathLike) -> None:
    """``UserError`` when ``folder`` is, lies in or holds a rehearsal (``rehearsals_in``): its runs are
    stand-in models trained a few steps, never a sweep's results, whatever their state says."""
    marked = rehearsals_in(folder)
    if not marked:
        return
    folder, rehearsal = Path(folder), marked[0]
    where = {folder: "is", folder.parent: "lies in"}.get(rehearsal, f"holds ({rehearsal.name})")
    raise UserError(
        Problem(
            str(folder),
            f"{where} a rehearsal (`klsweep rehearse`: stand-in models, a few steps), not a sweep's results",
            f"a sweep folder made by `klsweep run`; remove the rehearsal (rm -r {rehearsal}) "
            "or use another --out",
        ),
        title="a rehearsal is not a sweep",
    )


def _existing(path: str | os.PathLike) -> Path:
    """``path``, or its nearest ancestor that exists."""
    p = Path(path).absolute()
    while not p.exists() and p.parent != p:
        p = p.parent
    return p


def not_a_folder(folder: str | os.PathLike) -> str | None:
    """Why ``folder`` cannot be (or become) a folder: a file is there or on the way; None when it can."""
    p = _existing(folder)
    if p.is_dir():
        return None
    on_the_way = f" (on the way to {folder})" if p != Path(folder).absolute() else ""
    return f"{p} is a file, not a folder{on_the_way}"


def check_writable(folder: str | os.PathLike, where: str, todo: str) -> None:
    """``UserError`` (located at ``where``, saying ``todo``) unless files can be written in ``folder``, or in the
    folder it would be created in. Tries it: permission bits, read-only mounts and a file in the way all count."""
    what = not_a_folder(folder)
    if what is not None:
        raise UserError(Problem(where, what, todo), title="cannot write there")
    p = _existing(folder)
    try:
        with tempfile.TemporaryFile(dir=p):
            pass
    except OSError as e:
        raise UserError(
            Problem(where, f"cannot write in {p}: {e.strerror or e}", todo), title="cannot write there"
        ) from e


def cache_dir() -> Path:
    """klsweep's cache of derived, rebuildable files: ``$KLSWEEP_CACHE``, default ``~/.cache/klsweep``."""
    return Path(os.environ.get("KLSWEEP_CACHE", "~/.cache/klsweep")).expanduser()


def links_out(root: str | os.PathLike, folders: list[Path]) -> list[Problem]:
    """A problem for each symbolic link that leads out of ``root`` on the way from ``root`` to each of
    ``folders`` (``<run>/eval`` on the way to ``<run>/eval/<hash>``), each folder itself and the files and
    folders directly in it (a run folder, its checkpoints/, its metrics.jsonl ...): klsweep writes only inside
    the results folder."""
    real_root = Path(os.path.realpath(root))
    top = Path(os.path.abspath(root))
    links: list[Path] = []
    for folder in folders:
        here = Path(os.path.abspath(folder))
        if top in here.parents:
            parts = here.relative_to(top).parts
            links += [p for i in range(1, len(parts)) if (p := top.joinpath(*parts[:i])).is_symlink()]
        if folder.is_symlink():
            links.append(folder)
        if folder.is_dir():
            links += [p for p in sorted(folder.iterdir()) if p.is_symlink()]
    problems = []
    for p in dict.fromkeys(links):
        real = Path(os.path.realpath(p))
        if real != real_root and real_root not in real.parents:
            problems.append(
                Problem(
                    str(p),
                    f"leads out of {root} (a symbolic link to {real}): klsweep writes only inside it",
                    f"a plain file or folder inside {root}: remove the link (move what it leads to there)",
                )
            )
    return problems


def refuse_links_out(root: str | os.PathLike, folders: list[Path]) -> None:
    """``UserError`` (exit 2), before anything is written, naming every link ``links_out`` finds: the one
    check of ``run``, ``eval`` and ``report`` (and ``study``, through them) on the folders they write in."""
    problems = links_out(root, folders)
    if problems:
        raise UserError(problems, title="a folder outside the results folder")
