"""The audits kept on disk (``store.cache_dir()/audit/``), keyed by the code that computes them and torch's
version: reports read them without importing torch."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from klsweep import grpo, kl, store

if TYPE_CHECKING:
    from collections.abc import Callable


from klsweep.audit.exact import AuditRow, audit, config_audit, rows_as_dicts
from klsweep.audit.objective import GRPOAuditRow, grpo_audit, grpo_config_audit


def cached_audit(behavior_shift: float = 0.0, importance: str = "none") -> list[AuditRow]:
    """``audit`` of the default policy, kept on disk under ``store.cache_dir()/audit/`` and keyed by the code of
    ``kl.py``, ``grpo.py`` and this package, torch's version and the options: reports then need not import
    torch."""
    return _cached(AuditRow, audit, behavior_shift=behavior_shift, importance=importance)


def cached_grpo_audit(**options: Any) -> list[GRPOAuditRow]:
    """``grpo_audit(**options)``, kept on disk like ``cached_audit``."""
    return _cached(GRPOAuditRow, grpo_audit, **options)


def cached_config_audit(**options: Any) -> list[AuditRow]:
    """``config_audit(**options)`` (``configs``: the terms, as keyword), kept on disk like ``cached_audit`` and
    keyed by the terms' configurations too: ``audit --framework`` of a file audited before needs no torch."""
    return _cached(AuditRow, config_audit, **options)


def cached_grpo_config_audit(**options: Any) -> list[GRPOAuditRow]:
    """``grpo_config_audit(**options)``, kept on disk like ``cached_config_audit``."""
    return _cached(GRPOAuditRow, grpo_config_audit, **options)


def _cached(row_type: type, compute: Callable[..., list], **options: Any) -> list:
    import hashlib
    from importlib.metadata import version
    from pathlib import Path

    key = hashlib.sha256(
        "\0".join(
            [
                *(Path(m.__file__).read_text() for m in (kl, grpo)),
                *(p.read_text() for p in sorted(Path(__file__).parent.glob("*.py"))),
                version("torch"),
                compute.__name__,
                repr(sorted(options.items())),
            ]
        ).encode()
    ).hexdigest()[:16]
    path = store.cache_dir() / "audit" / f"{key}.json"
    try:
        rows = _rows(row_type, store.read_json(path))
    except (OSError, ValueError, store.UnreadableFile):  # missing, unreadable, not JSON: computed afresh
        rows = None
    if rows is not None:
        return rows
    rows = compute(**options)
    try:
        store.write_json(path, rows_as_dicts(rows))
    except OSError as e:  # a read-only or full cache: the audit is still right, only computed again next time
        import warnings

        why = e.strerror or type(e).__name__
        warnings.warn(f"audit cache {path} not written ({why}): computed again next time", CacheWarning, 3)
    return rows


class CacheWarning(UserWarning):
    """A cache klsweep could not write (the result stands; it is computed again next time)."""


def _rows(row_type: type, data: Any) -> list | None:
    """The rows a cache entry holds, or None when it is not a non-empty list of rows with exactly the fields
    of ``row_type``, each of its type (a str, an int, a float: an int too), and a known verdict."""
    import dataclasses
    import typing

    from klsweep.audit.exact import VERDICTS
    from klsweep.audit.objective import GRPO_VERDICTS

    types = typing.get_type_hints(row_type)
    kinds = {str: (str,), int: (int,), float: (int, float)}

    def right(name: str, v: Any) -> bool:
        return isinstance(v, kinds.get(types[name], (types[name],))) and not isinstance(v, bool)

    if not isinstance(data, list) or not data:
        return None
    fields = {f.name for f in dataclasses.fields(row_type)}
    for row in data:
        if not isinstance(row, dict) or set(row) != fields or not all(right(k, v) for k, v in row.items()):
            return None
        if row["verdict"] not in (*VERDICTS, *GRPO_VERDICTS):
            return None
    return [row_type(**row) for row in data]
