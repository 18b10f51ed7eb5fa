"""A photo's copy signal: 63 bits that say "the same photo" where an embedding says "the same kind of scene".

The signs of the 8 x 8 lowest-frequency DCT coefficients (without the mean) of the photo as the backbone sees it,
reduced to 32 x 32 grey: resizing, recompression, small crops and tone changes keep them, a different photo flips
about half. Two photos' distance is the least over the four quarter turns (:func:`rotations`). A near-blank photo
(spread below :data:`FLAT_STD`) is marked ``flat``: its bits are noise. Stored per photo in its table row
(``copy_hash``: 16 hex digits; ``copy_flat``: true).
"""

from __future__ import annotations

import numpy as np

SIDE = 32  # the grey image the DCT is taken of
LOW = 8  # the 8 x 8 lowest frequencies: 63 bits without the mean
FLAT_STD = 6.0  # grey-level spread (of 255) below which a photo is near-blank
BITS = LOW * LOW - 1


def _dct_matrix(n: int) -> np.ndarray:
    k, x = np.arange(n)[:, None], np.arange(n)[None, :]
    return np.cos(np.pi * (2 * x + 1) * k / (2 * n))


_C = _dct_matrix(SIDE)[:LOW]  # only the low rows are needed
_ODD = (np.arange(LOW) % 2 == 1)


def grey(pixels: np.ndarray) -> np.ndarray:
    """A (H, W, 3) uint8 photo as a SIDE x SIDE grey image (block means; float)."""
    from PIL import Image

    a = np.asarray(pixels)
    if a.ndim == 3:
        a = a[..., :3] @ np.array([0.299, 0.587, 0.114])
    im = Image.fromarray(np.clip(a, 0, 255).astype(np.uint8))
    return np.asarray(im.resize((SIDE, SIDE), Image.BOX), dtype=np.float64)


def _pack(bits: np.ndarray) -> int:
    flat = bits.reshape(-1)[1:]  # without the mean's (0, 0)
    return int("".join("1" if b else "0" for b in flat), 2)


def copy_signal(pixels: np.ndarray) -> dict:
    """``{"copy_hash": 16 hex digits}`` of a photo's pixels, with ``"copy_flat": True`` for a near-blank photo."""
    g = grey(pixels)
    coef = _C @ g @ _C.T
    out = {"copy_hash": f"{_pack(coef > 0):016x}"}
    if float(g.std()) < FLAT_STD:
        out["copy_flat"] = True
    return out


def _unpack(h: int) -> np.ndarray:
    bits = np.array([0] + [(h >> (BITS - 1 - i)) & 1 for i in range(BITS)], dtype=bool)
    return bits.reshape(LOW, LOW)


def rotations(h: int) -> list[int]:
    """The bits of the photo turned by 0, 90, 180 and 270 degrees, from its own: turning by half a turn flips both
    axes (the signs of the odd frequencies of each); a quarter turn transposes the frequencies and flips one axis."""
    b = _unpack(h)
    fx, fy = b ^ _ODD[None, :], b ^ _ODD[:, None]
    half = fx ^ _ODD[:, None]
    return [_pack(b), _pack(fx.T), _pack(half), _pack(fy.T)]


def hash_table(hashes: list[str | None]) -> np.ndarray:
    """(n, 4) uint64: each photo's bits in its four turns (0 where it has none)."""
    out = np.zeros((len(hashes), 4), dtype=np.uint64)
    for i, h in enumerate(hashes):
        if h:
            out[i] = rotations(int(h, 16))
    return out


def distances(table: np.ndarray, i: np.ndarray, j: np.ndarray) -> np.ndarray:
    """The least number of differing bits between photo ``i`` as it is and photo ``j`` in any of its turns."""
    x = table[np.asarray(i, dtype=np.int64), :1] ^ table[np.asarray(j, dtype=np.int64)]
    return np.bitwise_count(x).min(axis=1).astype(np.int64)


def near_pairs(hashes: list[str | None], max_bits: int, skip=()) -> list[tuple[int, int, int]]:
    """(i, j, bits) with i < j for every two photos at most ``max_bits`` apart in some turn, found without comparing
    every pair: split into ``max_bits + 1`` runs of bits, two such photos agree on one run exactly (a lookup).
    ``skip``: rows left out (near-blank photos, whose bits are noise)."""
    table = hash_table(hashes)
    rows = [i for i, h in enumerate(hashes) if h and i not in set(skip)]
    runs = max_bits + 1
    edges = np.linspace(0, 64, runs + 1).astype(int)
    found: set[tuple[int, int]] = set()
    for a, b in zip(edges[:-1], edges[1:], strict=True):
        mask = np.uint64(((1 << (b - a)) - 1) << (64 - b))
        buckets: dict[int, list[int]] = {}
        for i in rows:
            buckets.setdefault(int(table[i, 0] & mask), []).append(i)
        for j in rows:
            for r in range(4):
                for i in buckets.get(int(table[j, r] & mask), ()):
                    if i != j:
                        found.add((min(i, j), max(i, j)))
    if not found:
        return []
    pairs = sorted(found)
    bits = distances(table, np.array([p[0] for p in pairs]), np.array([p[1] for p in pairs]))
    return [(i, j, int(d)) for (i, j), d in zip(pairs, bits, strict=True) if d <= max_bits]
