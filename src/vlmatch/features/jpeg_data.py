"""Whether a JPEG's data covers the size its header claims.

libjpeg does not fail on a header that claims more than the data holds (damaged, or patched to 65,000 x 65,000): it
fills the missing blocks with flat mid-grey. Two exact checks: :func:`claim_problem`, before decoding (a Huffman JPEG
spends at least one bit per 8 x 8 block, so ``n`` bytes hold at most ``8 n`` blocks), and :func:`ran_out`, after a
decode that ends in that grey (decoded again with noise after each scan: a scan that ran out decodes it, so the
pixels differ; a complete one skips it).
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass, field

NOISE = bytes((i * 97 + 13) % 255 for i in range(512))  # never 0xFF: no marker, nothing to stuff
_SOF = set(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}  # frame headers (C4: DHT, C8: reserved, CC: DAC)
_ARITHMETIC = {0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}


@dataclass
class Layout:
    width: int = 0
    height: int = 0
    huffman: bool = True
    scan_ends: list[int] = field(default_factory=list)  # where each scan's entropy-coded data ends


def layout(data: bytes, scans: bool = True) -> Layout | None:
    """The frame size and (with ``scans``) where each scan's data ends, from the markers; None when they cannot
    be followed. Without ``scans`` it stops at the first scan (the header alone: no walk through the data)."""
    if data[:2] != b"\xff\xd8":
        return None
    out, i, n = Layout(), 2, len(data)
    while i + 1 < n:
        if data[i] != 0xFF:
            return None
        m = data[i + 1]
        if m == 0xFF:  # fill byte
            i += 1
            continue
        if m == 0xD9:
            break
        if 0xD0 <= m <= 0xD7 or m == 0x01:
            i += 2
            continue
        if i + 4 > n:
            return None
        end = i + 2 + int.from_bytes(data[i + 2:i + 4], "big")
        if m in _SOF and end <= n and i + 9 <= n:
            out.height, out.width = int.from_bytes(data[i + 5:i + 7], "big"), int.from_bytes(data[i + 7:i + 9], "big")
            out.huffman = m not in _ARITHMETIC
        if m == 0xDA:
            if not scans:
                break
            end = _entropy_end(data, end)
            out.scan_ends.append(end)
        i = end
    return out


def _entropy_end(data: bytes, j: int) -> int:
    """Where the entropy-coded data starting at ``j`` ends: the first 0xFF of the next marker (not a stuffed
    0xFF00, not a restart marker), or the end of the file."""
    n = len(data)
    while True:
        j = data.find(b"\xff", j)
        if j < 0 or j + 1 >= n:
            return n
        k = j
        while k + 1 < n and data[k + 1] == 0xFF:
            k += 1
        nxt = data[k + 1] if k + 1 < n else 0xD9
        if nxt == 0 or 0xD0 <= nxt <= 0xD7:
            j = k + 2
            continue
        return j


def claim_problem(data: bytes, lay: Layout) -> str | None:
    """Why the header's size cannot be held by ``data`` (None: it can, as far as its size tells)."""
    if not lay.huffman or not lay.width or not lay.height:
        return None
    blocks = math.ceil(lay.width / 8) * math.ceil(lay.height / 8)
    if 8 * len(data) >= blocks:
        return None
    return (f"its header claims {lay.width}x{lay.height} pixels, more than its {len(data)} bytes can hold (at least "
            f"one bit per 8x8 block): a damaged or altered JPEG")


def looks_filled(im) -> bool:
    """Whether the last decoded pixel is the flat mid-grey of a zero block (the mark of data that ran out)."""
    px = im.getpixel((im.width - 1, im.height - 1))
    return all(v in (127, 128) for v in (px if isinstance(px, tuple) else (px,)))


def ran_out(data: bytes, lay: Layout, decoded: bytes, decode) -> bool:
    """Whether ``decoded`` (the pixels ``decode(data)`` gave) changes when noise follows each scan's data:
    then a scan ran out of data before its blocks were all decoded."""
    if not lay.scan_ends:
        return False
    parts, at = [], 0
    for end in lay.scan_ends:
        parts += [data[at:end], NOISE]
        at = end
    parts.append(data[at:])
    try:
        return decode(io.BytesIO(b"".join(parts))) != decoded
    except Exception:  # noqa: BLE001 - the noise reached the decoder: a scan was short of data
        return True


def ran_out_problem(lay: Layout) -> str:
    return (f"its header claims {lay.width}x{lay.height} pixels, but its data ends before them (the rest would "
            "decode as flat grey): a truncated or altered JPEG")
