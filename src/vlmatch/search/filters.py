"""Filters of a photo search (``--after``, ``--before``, ``--camera``, ``--under``, ``--near``), applied in stage 1
so that a filtered query returns its true top k among the matching photos.

:class:`Where` is the one description every interface passes; the folder backend applies it as a FAISS id selector
over :meth:`Where.mask`'s rows (or scores those rows exactly when at most :data:`EXACT_BELOW` match), Milvus as a
boolean expression (:mod:`vlmatch.search.backends.milvus.filters`). What each filter keeps: docs/search.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from datetime import date, datetime, time

import numpy as np

from ..errors import ConfigError

EARTH_KM = 6371.0088
EXACT_BELOW = 20_000  # a filter that keeps at most this many photos is searched exactly (brute force)
_EPOCH = datetime(1970, 1, 1)


def clock_seconds(t: datetime) -> int:
    """A time as shown on its clock (offset dropped), in seconds since 1970-01-01 00:00."""
    return int((t.replace(tzinfo=None) - _EPOCH).total_seconds() // 1)


def taken_seconds(taken) -> float:
    """A row's ``taken`` (ISO 8601) as :func:`clock_seconds`; NaN when it has none (or an unreadable one)."""
    if not isinstance(taken, str) or not taken:
        return math.nan
    try:
        return float(clock_seconds(datetime.fromisoformat(taken)))
    except ValueError:
        return math.nan


def _bound(value, name: str, end: bool) -> int | None:
    if value is None or value == "":
        return None
    if isinstance(value, datetime):
        return clock_seconds(value)
    text = str(value).strip()
    try:
        if isinstance(value, date) or len(text) == 10:  # a whole day: from its first second to its last
            d = value if isinstance(value, date) else date.fromisoformat(text)
            return clock_seconds(datetime.combine(d, time.max if end else time.min))
        return clock_seconds(datetime.fromisoformat(text.replace("Z", "+00:00")))
    except ValueError:
        raise ConfigError(f"{name} {text!r}: expected a date YYYY-MM-DD or an ISO 8601 time "
                          f"(2023-06-01T18:30:00)") from None


def _near(value) -> tuple[float, float, float] | None:
    if value is None or value == "":
        return None
    parts = value.split(",") if isinstance(value, str) else list(value)
    try:
        lat, lon, km = (float(p) for p in parts)
    except (TypeError, ValueError):
        raise ConfigError(f"near {value!r}: expected LAT,LON,KM (three numbers: 48.85,2.35,10)") from None
    if not (-90 <= lat <= 90 and -180 <= lon <= 180 and math.isfinite(km) and km >= 0):
        raise ConfigError(f"near {value!r}: latitude in -90..90, longitude in -180..180 and a distance >= 0 km")
    return lat, lon, km


def _printable(value, name: str) -> None:
    """A camera or folder name holds no control character (a newline, a tab, NUL): none is in a camera
    name or a path this index stores, and one would reach a backend's expression as it is."""
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in str(value)):
        raise ConfigError(f"{name} {value!r}: holds a control character (a newline, a tab?); give the text alone")


def _under(value) -> str | None:
    if value is None:
        return None
    _printable(value, "under")
    text = str(value).replace("\\", "/").strip()
    parts = [p for p in text.split("/") if p not in ("", ".")]
    if text.startswith("/") or ".." in parts:
        raise ConfigError(f"under {value!r}: a subfolder of the indexed photo folder, relative to it (2023/summer)")
    return "/".join(parts) or None


def haversine_km(lat1, lon1, lat2, lon2):
    """Great-circle distance in km (numpy arrays or floats)."""
    p1, p2 = np.radians(lat1), np.radians(lat2)
    a = np.sin((p2 - p1) / 2) ** 2 + np.cos(p1) * np.cos(p2) * np.sin(np.radians(lon2 - lon1) / 2) ** 2
    return 2 * EARTH_KM * np.arcsin(np.sqrt(np.clip(a, 0.0, 1.0)))


@dataclass(frozen=True)
class Where:
    """Which photos a search may return; every field optional (see the module's text)."""

    after: str | None = None
    before: str | None = None
    camera: str | None = None
    under: str | None = None
    near: tuple[float, float, float] | None = None

    def __post_init__(self):
        # checked once, here: every interface gets the same one-line messages
        object.__setattr__(self, "_after", _bound(self.after, "after", end=False))
        object.__setattr__(self, "_before", _bound(self.before, "before", end=True))
        object.__setattr__(self, "near", _near(self.near))
        object.__setattr__(self, "under", _under(self.under))
        if self.camera is not None:
            _printable(self.camera, "camera")
        cam = (self.camera or "").strip().lower()
        object.__setattr__(self, "camera", cam or None)
        if self._after is not None and self._before is not None and self._after > self._before:
            raise ConfigError(f"after {self.after} is later than before {self.before}: no photo can match")

    @classmethod
    def of(cls, where) -> Where | None:
        """``where`` as a Where: None, a Where, or a dict with its keys (None: no filter)."""
        if where is None or isinstance(where, Where):
            return where if where is None or where.active else None
        if isinstance(where, dict):
            names = {f.name for f in fields(cls)}
            unknown = sorted(set(where) - names)
            if unknown:
                raise ConfigError(f"unknown filter(s) {unknown}: expected {sorted(names)}")
            return cls.of(cls(**where))
        raise ConfigError(f"a filter is a vlmatch.search.filters.Where or a dict, not {type(where).__name__}")

    @property
    def active(self) -> bool:
        return any(v is not None for v in (self._after, self._before, self.camera, self.under, self.near))

    @property
    def seconds(self) -> tuple[int | None, int | None]:
        """(after, before) as :func:`clock_seconds`, inclusive; None where open."""
        return self._after, self._before

    def to_dict(self) -> dict:
        d = {"after": self.after, "before": self.before, "camera": self.camera, "under": self.under,
             "near": list(self.near) if self.near else None}
        return {k: v for k, v in d.items() if v is not None}

    # --- evaluation on table rows -------------------------------------------------------------------
    def matches(self, row: dict) -> bool:
        """Whether one table row (``taken``, ``camera``, ``rel``, ``gps``) passes."""
        return bool(self.mask(Columns([row]))[0])

    def mask(self, cols: Columns) -> np.ndarray:
        """The rows of a table (:class:`Columns`) that pass, as a bool array."""
        keep = np.ones(len(cols), dtype=bool)
        if self._after is not None or self._before is not None:
            t = cols.taken
            with np.errstate(invalid="ignore"):
                keep &= ~np.isnan(t)
                if self._after is not None:
                    keep &= t >= self._after
                if self._before is not None:
                    keep &= t <= self._before
        if self.camera is not None:
            hit = {c: self.camera in c for c in set(cols.camera)}
            keep &= np.fromiter((hit[c] for c in cols.camera), dtype=bool, count=len(cols))
        if self.under is not None:
            prefix = self.under + "/"
            keep &= np.fromiter((r.startswith(prefix) for r in cols.rel), dtype=bool, count=len(cols))
        if self.near is not None:
            lat, lon, km = self.near
            with np.errstate(invalid="ignore"):
                keep &= haversine_km(lat, lon, cols.lat, cols.lon) <= km  # NaN (no GPS) is never <=
        return keep


class Columns:
    """A table's filterable columns as arrays (built once per opened collection)."""

    def __init__(self, rows: list[dict]):
        self.taken = np.array([taken_seconds(r.get("taken")) for r in rows], dtype=np.float64)
        self.camera = [str(r.get("camera") or "").lower() for r in rows]
        self.rel = [str(r.get("rel") or "") for r in rows]
        gps = [r.get("gps") if isinstance(r.get("gps"), (list, tuple)) and len(r.get("gps")) == 2 else (math.nan,) * 2
               for r in rows]
        self.lat = np.array([g[0] for g in gps], dtype=np.float64)
        self.lon = np.array([g[1] for g in gps], dtype=np.float64)

    def __len__(self) -> int:
        return len(self.taken)


def top_k_of(queries: np.ndarray, vectors, rows: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Exact top ``k`` (scores, rows) per query among ``rows`` of ``vectors`` (ties: lower row first); rows
    -1 and scores -inf where fewer than ``k`` rows are given."""
    nq = len(queries)
    scores = np.full((nq, k), -np.inf, dtype=np.float32)
    keys = np.full((nq, k), -1, dtype=np.int64)
    if len(rows):
        rows = np.sort(np.asarray(rows, dtype=np.int64))
        s = queries @ np.asarray(vectors[rows], dtype=np.float32).T
        m = min(k, len(rows))
        order = np.argsort(-s, axis=1, kind="stable")[:, :m]
        scores[:, :m] = np.take_along_axis(s, order, axis=1)
        keys[:, :m] = rows[order]
    return scores, keys
