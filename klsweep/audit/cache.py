"""The audits kept on disk (``store.cache_dir()/audit/``), keyed by the code that computes them and torch's
version: reports read them without importing torch."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from klsweep import grpo, kl, store

if TYPE_CHECKING:
    from collections.abc import Callable


from klsweep.audit.exact import AuditRow, audit, rows_as_dicts
from klsweep.audit.objective import GRPOAuditRow, grpo_audit


def cached_audit(behavior_shift: float = 0.0, importance: str = "none") -> list[AuditRow]:
    """``audit`` of the default policy, kept on disk under ``store.cache_dir()/audit/`` and keyed by the code of
    ``kl.py``, ``grpo.py`` and this package, torch's version and the options: reports then need not import
    torch."""
    return _cached(AuditRow, audit, behavior_shift=behavior_shift, importance=importance)


def cached_grpo_audit(**options: Any) -> list[GRPOAuditRow]:
    """``grpo_audit(**options)``, kept on disk like ``cached_audit``."""
    return _cached(GRPOAuditRow, grpo_audit, **options)


def _cached(row_type: type, compute: Callable[..., list], **options: Any) -> list:
    import hashlib
    import json
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
    if path.exists():
        try:
            return [row_type(**row) for row in store.read_json(path)]
        except (OSError, TypeError, json.JSONDecodeError):
            pass  # a stale or damaged cache entry is recomputed
    rows = compute(**options)
    store.write_json(path, rows_as_dicts(rows))
    return rows
