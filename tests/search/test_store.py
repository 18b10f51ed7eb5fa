"""The encoding store: float16 by default, float32 for the fields a model marks as sensitive."""

import json

import numpy as np
import torch

from vlmatch import create_model
from vlmatch.search.store import EncodingStore, EncodingWriter


def write_store(folder, enc, float_dtype):
    """A whole encoding held in memory -> a store, through the writer that builds and updates use."""
    w = EncodingWriter(folder, len(enc), float_dtype)
    w.write(0, enc)
    w.finish()


def test_full_precision_fields_stay_float32_in_a_float16_store(tmp_path):
    torch.manual_seed(0)
    model = create_model("caan", img_dim=24, embed_dim=16, attn_dim=8, word_dim=8, vocab_size=30).eval()
    with torch.no_grad():
        img = model.encode_images(torch.randn(6, 5, 24))
        txt = model.encode_texts(torch.randint(4, 30, (3, 7)), torch.tensor([7, 5, 3]))
    assert type(img).full_precision_fields == ("vk",)
    write_store(tmp_path / "img", img, "float16")
    write_store(tmp_path / "txt", txt, "float16")
    si, st = EncodingStore(tmp_path / "img", img), EncodingStore(tmp_path / "txt", txt)
    assert si.fields["vk"]["dtype"] == "float32" and si.fields["regions"]["dtype"] == "float16"
    assert st.fields["words"]["dtype"] == "float32" and st.fields["p2"]["dtype"] == "float16"
    assert si.dtype == st.dtype == "float16"
    back_i, back_t = si.take(np.arange(6)), st.take(np.arange(3))
    assert torch.equal(back_i.vk, img.vk) and torch.equal(back_t.words, txt.words)
    assert not torch.equal(back_i.regions, img.regions)  # rounded to float16
    with torch.no_grad():
        diff = (model.score(back_i, back_t) - model.score(img, txt)).abs().max().item()
    assert diff < 1e-3


def test_models_without_sensitive_fields_store_every_float_in_the_store_dtype(tmp_path):
    model = create_model("scan_t2i_avg", img_dim=24, embed_dim=16, word_dim=8, vocab_size=30).eval()
    with torch.no_grad():
        img = model.encode_images(torch.randn(4, 5, 24))
    write_store(tmp_path / "img", img, "float16")
    assert {f["dtype"] for f in EncodingStore(tmp_path / "img", img).fields.values()} == {"float16"}


def test_concatenating_stores_keeps_the_widest_dtype_of_each_field(tmp_path):
    """An index built before a field became full precision, updated afterwards: the merged field
    widens to float32 (the old rows exactly as stored, the new rows unrounded)."""
    from vlmatch.search.build import concat_stores

    torch.manual_seed(1)
    model = create_model("caan", img_dim=24, embed_dim=16, attn_dim=8, word_dim=8, vocab_size=30).eval()
    with torch.no_grad():
        old, new = model.encode_images(torch.randn(3, 5, 24)), model.encode_images(torch.randn(2, 5, 24))
    write_store(tmp_path / "old", old, "float16")
    meta = json.loads((tmp_path / "old/fields.json").read_text())  # as written before the change
    np.save(tmp_path / "old/vk.npy", old.vk.numpy().astype(np.float16))
    meta["fields"]["vk"]["dtype"] = "float16"
    (tmp_path / "old/fields.json").write_text(json.dumps(meta))
    write_store(tmp_path / "new", new, "float16")
    concat_stores([tmp_path / "old", tmp_path / "new"], tmp_path / "merged", "float16")
    merged = EncodingStore(tmp_path / "merged", old)
    assert merged.fields["vk"]["dtype"] == "float32" and merged.fields["regions"]["dtype"] == "float16"
    vk = merged.take(np.arange(5)).vk
    assert torch.equal(vk[3:], new.vk)
    assert torch.equal(vk[:3], old.vk.half().float())


def test_values_a_store_cannot_hold_are_refused_when_written(tmp_path):
    import pytest

    from vlmatch.errors import DataError
    from vlmatch.models.base import ImageEncoding

    regions = torch.ones(3, 4, 8)
    regions[1, 2, 5] = 1e5  # beyond float16's range: it would be stored as inf
    with pytest.raises(DataError, match=r"regions.npy: NaN or inf in the encodings of rows 0..2 \(as float16\)"):
        write_store(tmp_path / "f16", ImageEncoding(regions=regions), "float16")
    write_store(tmp_path / "f32", ImageEncoding(regions=regions), "float32")  # float32 holds it
    regions[0, 0, 0] = float("nan")
    with pytest.raises(DataError, match="NaN or inf"):
        write_store(tmp_path / "nan", ImageEncoding(regions=regions), "float32")
