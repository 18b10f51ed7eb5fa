"""A small photo library with EXIF written by the tests (dates, cameras, GPS, subfolders, some photos
with none and some with broken tags), untrained models on the tiny backbone, and its index."""

from __future__ import annotations

from pathlib import Path

from tests.features.photo_exif import save_photo

CAMERAS = [("Canon", "Canon EOS 5D"), ("Apple", "iPhone 12"), ("NIKON CORPORATION", "NIKON D750"), (None, None)]
PLACES = [(48.8566, 2.3522), (48.90, 2.40), (51.5074, -0.1278), (-33.8688, 151.2093), None]
SENTENCES = ["a dog on the grass", "a red ball in the park", "two people walk on the beach", "a cat on a sofa"]


def make_library(root: Path, n: int = 36) -> Path:
    """``n`` photos under ``root``: 2021/…, 2022/summer/…, misc/…; one in six without a date, one in
    twelve with a broken date, one in five without GPS."""
    for i in range(n):
        folder = ("2021", "2022/summer", "misc")[i % 3]
        year = 2021 + (i % 3 == 1)
        month, day = 1 + i % 12, 1 + (i * 7) % 28
        taken = f"{year}:{month:02d}:{day:02d} {i % 24:02d}:{(i * 13) % 60:02d}:00"
        if i % 6 == 5:
            taken = None
        elif i % 12 == 4:
            taken = "2021:13:45 99:00:00"  # broken: indexed without a date, with a note
        make, model = CAMERAS[i % len(CAMERAS)]
        save_photo(root / folder / f"p{i:02d}.jpg", size=(24 + i % 5, 20), seed=i, taken=taken,
                   offset="+02:00" if i % 4 == 0 else None, make=make, model=model, gps=PLACES[i % len(PLACES)])
    return root


def save_tiny_models(folder: Path) -> dict[str, Path]:
    """An untrained SCAN t-i and VSE++ on the tiny backbone's 32-d features."""
    import torch

    from vlmatch import create_model
    from vlmatch.data.vocab import Vocab

    vocab = Vocab.build(SENTENCES, 1)
    out = {}
    for key, name in (("model", "scan_t2i_avg"), ("retriever", "vsepp")):
        torch.manual_seed(0)
        m = create_model(name, img_dim=32, embed_dim=16, word_dim=8, vocab_size=len(vocab))
        m.vocab = vocab
        out[key] = m.save(folder / key)
    return out
