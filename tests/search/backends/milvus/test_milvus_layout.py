"""A photo's stage-2 encoding over Milvus rows: both grid sizes round-trip through milvus-lite, every
row stays under Milvus's 32,768 dimensions and every RPC under its 64 MB."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("milvus_lite")

from vlmatch.models.base import ImageEncoding, TextEncoding  # noqa: E402
from vlmatch.search.backends.milvus.client import MAX_DIM, RPC_BYTES, connect  # noqa: E402
from vlmatch.search.backends.milvus.layout import Layout, create_encodings, pack_float16, unpack_float16  # noqa: E402


def _images(n, grid, d=512, seed=0):
    g = torch.Generator().manual_seed(seed)
    k = grid * grid
    mask = torch.ones(n, k, dtype=torch.bool)
    mask[0, -3:] = False
    return ImageEncoding(regions=torch.randn(n, k, d, generator=g), mask=mask)


@pytest.mark.parametrize("grid, vector, chunks", [(7, "FLOAT_VECTOR", 1), (14, "FLOAT_VECTOR", 4),
                                                 (7, "FLOAT16_PACKED", 1), (10, "FLOAT16_PACKED", 1),
                                                 (14, "FLOAT16_PACKED", 2)])
def test_both_grid_sizes_round_trip_through_milvus_lite_in_chunks_under_the_limits(tmp_path, grid, vector, chunks):
    enc = _images(5, grid)
    layout = Layout.of(enc.select(slice(0, 1)), "float16", vector)
    assert layout.total == grid * grid * 512 and layout.chunks == chunks
    assert layout.field_dim <= MAX_DIM and layout.rows_per_rpc() * layout.row_bytes() <= RPC_BYTES
    assert layout.field_dim * (2 if vector == "FLOAT16_PACKED" else 1) == layout.chunk_dim
    client = connect(str(tmp_path / "l.db"))
    create_encodings(client, "enc", layout)
    ids = [3, 10, 11, 40, 41]
    rows = layout.rows(np.array(ids), enc)
    assert len(rows) == 5 * chunks and len({r["pk"] for r in rows}) == 5 * chunks
    client.upsert("enc", rows)
    client.upsert("enc", rows[:chunks])  # written twice (a resumed batch): still one row per pk
    client.load_collection("enc")
    want = [11, 3, 41]
    got = {int(r["pk"]): r for r in client.get("enc", ids=layout.pks(want), output_fields=["pk", "enc", "extra"])}
    back = layout.decode(want, got, ImageEncoding, "enc")
    sel = [ids.index(i) for i in want]
    # stored as the folder's store stores them: float16 values (exactly), the mask as it was
    assert torch.equal(back.regions, enc.regions[sel].half().float())
    assert torch.equal(back.mask, enc.mask[sel])
    assert client.query("enc", filter="", output_fields=["count(*)"])[0]["count(*)"] == 5 * chunks


def test_a_word_axis_is_padded_and_full_precision_fields_stay_float32():
    enc = TextEncoding(lengths=torch.tensor([3, 5]), words=torch.randn(2, 5, 8) / 3)
    layout = Layout.of(enc, "float16", "FLOAT16_VECTOR", pad_to=7)
    assert layout.fields["words"]["shape"] == [7, 8] and layout.fields["lengths"]["where"] == "extra"
    rows = layout.rows(np.array([0, 1]), enc)
    back = layout.decode([1, 0], {r["pk"]: r for r in rows}, TextEncoding, "enc")
    assert back.words.shape == (2, 7, 8) and torch.equal(back.words[:, :5], enc.words[[1, 0]].half().float())
    assert back.lengths.tolist() == [5, 3]

    class Full(ImageEncoding):
        full_precision_fields = ("embedding",)

    f = Full(regions=torch.randn(1, 4, 8), embedding=torch.randn(1, 8) / 7)
    lay16 = Layout.of(f, "float16", "FLOAT16_VECTOR")
    assert lay16.fields["embedding"] == {"shape": [8], "dtype": "float32", "where": "extra"}
    back = lay16.decode([0], {r["pk"]: r for r in lay16.rows(np.array([0]), f)}, Full, "enc")
    assert torch.equal(back.embedding, f.embedding)  # not rounded to float16


def test_a_nan_is_refused_naming_the_items():
    enc = _images(2, 2, d=4)
    enc.regions[1, 0, 0] = float("nan")
    layout = Layout.of(enc, "float16", "FLOAT_VECTOR")
    with pytest.raises(Exception, match=r"NaN or inf in the regions of items 7\.\.8"):
        layout.rows(np.array([7, 8]), enc)


def _every_float16() -> np.ndarray:
    """Every finite float16 value (subnormals, both zeros, the largest), in a random order."""
    bits = np.arange(2**16, dtype=np.uint32).astype(np.uint16)
    vals = bits.view(np.float16)
    vals = vals[np.isfinite(vals)]
    return np.random.default_rng(0).permutation(vals)


def test_packing_keeps_every_finite_float16_bit_for_bit_and_makes_only_finite_floats():
    vals = _every_float16()
    packed = pack_float16(vals.reshape(1, -1))
    assert packed.dtype == np.float32 and packed.shape == (1, len(vals) // 2) and np.isfinite(packed).all()
    assert np.array_equal(unpack_float16(packed).view(np.uint16), vals.reshape(1, -1).view(np.uint16))
    # the layout is the same on every host: value 2k in the high half of float32 k
    one = pack_float16(np.array([1.0, -2.0], dtype=np.float16))
    assert one.view(np.uint32).tolist() == [0x3C00C000]


def test_milvus_lite_returns_packed_float16_rows_bit_for_bit(tmp_path):
    """Subnormal and negative-zero float32s travel through the server and pymilvus's Python floats intact."""
    every = _every_float16()
    vals = np.resize(every, 14 * 14 * 512)  # every finite float16 once, then again from the start
    enc = ImageEncoding(regions=torch.from_numpy(vals.astype(np.float32)).reshape(1, 196, 512),
                        mask=torch.ones(1, 196, dtype=torch.bool))
    layout = Layout.of(enc, "float16", "FLOAT16_PACKED")
    assert layout.chunks == 2 and len(every) < len(vals)
    client = connect(str(tmp_path / "p.db"))
    create_encodings(client, "enc", layout)
    client.upsert("enc", layout.rows(np.array([5]), enc))
    client.load_collection("enc")
    got = {int(r["pk"]): r for r in client.get("enc", ids=layout.pks([5]), output_fields=["pk", "enc", "extra"])}
    back = layout.decode([5], got, ImageEncoding, "enc")
    assert np.array_equal(back.regions.numpy().astype(np.float16).view(np.uint16).ravel(), vals.view(np.uint16))


def test_full_precision_fields_keep_float_vector_rows_rather_than_json_on_a_server_without_float16():
    class Full(ImageEncoding):
        full_precision_fields = ("embedding",)

    f = Full(regions=torch.randn(2, 4, 8), embedding=torch.randn(2, 8) / 7)
    layout = Layout.of(f, "float16", "FLOAT16_PACKED")
    assert layout.vector == "FLOAT_VECTOR" and layout.fields["embedding"]["where"] == "vector"
    back = layout.decode([1], {r["pk"]: r for r in layout.rows(np.array([0, 1]), f)}, Full, "enc")
    assert torch.equal(back.embedding, f.embedding[1:]) and torch.equal(back.regions, f.regions[1:].half().float())
    plain = ImageEncoding(regions=torch.randn(1, 4, 8), mask=torch.ones(1, 4, dtype=torch.bool))
    assert Layout.of(plain, "float16", "FLOAT16_PACKED").vector == "FLOAT16_PACKED"
