"""Query-bank calibration (the inverted softmax, QB-Norm's IS form, both directions) against the paper's
equation, loop by loop."""

import json
import math

import pytest
import torch

from vlmatch import load_model
from vlmatch.checkpoints.seal import seal_checkpoint
from vlmatch.data.vocab import Vocab
from vlmatch.errors import DataError
from vlmatch.models.calibration import Calibration, compress, expand, load_calibration
from vlmatch.models.registry import create_model

KW = dict(img_dim=6, embed_dim=8, word_dim=4, vocab_size=12, text_pool="mean")
BETA = 7.0


def _unit(n, d, seed):
    return torch.nn.functional.normalize(torch.randn(n, d, generator=torch.Generator().manual_seed(seed),
                                                     dtype=torch.float64), dim=1)


def _model(**banks):
    torch.manual_seed(0)
    m = create_model("vsepp", **KW).double().eval()
    m.vocab = Vocab.build(["a dog runs on grass", "a red ball"], min_count=1)
    if banks:
        m.calibration = Calibration(BETA, **{f"{k}_bank": v for k, v in banks.items()})
    return m


def _encode(m):
    feats = torch.randn(4, 5, 6, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    tokens, lengths = m.tokenize(["a dog runs", "a red ball", "grass", "a dog on a red ball"])
    with torch.no_grad():
        return m.encode_images(feats), m.encode_texts(tokens, lengths)


def _p_image_given_caption(sim, bank_sims):
    """Inverted softmax of one (image, caption) pair: exp(beta s(I, T)) / sum_b exp(beta s(I, b))."""
    return math.exp(BETA * sim) / sum(math.exp(BETA * s) for s in bank_sims)


def test_the_calibrated_score_ranks_images_by_the_inverted_softmax_over_the_caption_bank():
    bank = _unit(9, 8, 1)
    raw_img, raw_txt = _encode(_model())
    m = _model(text=bank)
    img, txt = _encode(m)
    with torch.no_grad():
        got = m.score(img, txt)
    for i in range(len(raw_img)):
        v = raw_img.embedding[i]
        bank_sims = [float(bank[b] @ v) for b in range(len(bank))]
        for j in range(len(raw_txt)):
            p = _p_image_given_caption(float(v @ raw_txt.embedding[j]), bank_sims)
            # s'(I, T) = (1 / beta) log(m p(I | T)): the same order of images for every caption
            assert got[i, j].item() == pytest.approx(math.log(len(bank) * p) / BETA, abs=1e-12)
    for j in range(len(raw_txt)):  # a caption's ranking of the images follows p(I | T)
        ps = [_p_image_given_caption(float(raw_img.embedding[i] @ raw_txt.embedding[j]),
                                     [float(bank[b] @ raw_img.embedding[i]) for b in range(len(bank))])
              for i in range(len(raw_img))]
        assert torch.argsort(got[:, j], descending=True).tolist() == sorted(range(len(ps)), key=lambda i: -ps[i])


def test_both_banks_subtract_each_items_own_offset_and_keep_the_image_rankings_of_the_caption_bank():
    tb, ib = _unit(9, 8, 1), _unit(7, 8, 2)
    raw_img, raw_txt = _encode(_model())
    both, text_only = _model(text=tb, image=ib), _model(text=tb)
    s_both = both.score(*_encode(both))
    s_text = text_only.score(*_encode(text_only))
    for i in range(4):
        c = math.log(sum(math.exp(BETA * float(tb[b] @ raw_img.embedding[i])) for b in range(9)) / 9) / BETA
        for j in range(4):
            d = math.log(sum(math.exp(BETA * float(ib[b] @ raw_txt.embedding[j])) for b in range(7)) / 7) / BETA
            want = float(raw_img.embedding[i] @ raw_txt.embedding[j]) - c - d
            assert s_both[i, j].item() == pytest.approx(want, abs=1e-12)
    # a caption's offset is constant in its own ranking: images ranked for each caption as with the text bank only
    assert torch.equal(s_both.argsort(dim=0), s_text.argsort(dim=0))


@pytest.mark.parametrize("banks", [("text",), ("image",), ("text", "image")])
def test_the_calibrated_score_is_the_inner_product_of_the_global_embeddings(banks):
    m = _model(**{b: _unit(5, 8, k) for k, b in enumerate(banks)})
    img, txt = _encode(m)
    a, b = m.global_embeddings(img, txt)
    assert a.shape[1] == b.shape[1] == 8 + len(banks)
    torch.testing.assert_close(a @ b.T, m.score(img, txt), atol=1e-12, rtol=0)


def test_a_bank_of_low_rank_is_stored_in_int8_in_its_own_directions():
    low = torch.randn(40, 3, dtype=torch.float64) @ torch.randn(3, 16, dtype=torch.float64)
    parts = compress(low, rank=3)
    assert parts["coef"].dtype == torch.int8 and parts["coef"].shape == (40, 3) and parts["basis"].shape == (3, 16)
    back = expand(parts).double()
    # int8 coefficients: each row within half a step (1/254 of its largest coefficient) per direction, plus float16
    assert ((back - low).norm(dim=1) / low.norm(dim=1)).max() < 0.01
    truncated = expand(compress(low, rank=2))  # fewer directions than the bank has: not the bank
    assert ((truncated.double() - low).norm(dim=1) / low.norm(dim=1)).max() > 0.05


def test_a_calibrated_checkpoint_round_trips_and_every_bad_file_is_named_in_one_line(tmp_path):
    m = _model()
    m.calibration = Calibration.fit(BETA, rank=8, text=_unit(30, 8, 1).float(), text_source="test captions")
    m.float().save(tmp_path / "ck")
    assert {"calibration.json", "calibration.safetensors"} <= {p.name for p in (tmp_path / "ck").iterdir()}
    back = load_model(tmp_path / "ck")
    assert back.calibration.beta == BETA and back.calibration.sources["text"]["source"] == "test captions"
    torch.testing.assert_close(back.calibration.text_bank, m.calibration.text_bank, atol=0, rtol=0)
    m.double()
    f = tmp_path / "ck" / "calibration.safetensors"
    f.write_bytes(f.read_bytes()[:-1] + b"\0")
    with pytest.raises(DataError, match=r"calibration.safetensors: content does not match the SHA-256 recorded in "
                                        r".*checksums.json"):
        load_model(tmp_path / "ck")
    with pytest.raises(DataError, match=r"calibration.safetensors: content does not match the SHA-256 recorded in "
                                        r"calibration.json"):
        load_calibration(tmp_path / "ck", 8)  # its own record checks it too (a checkpoint saved before checksums)
    (tmp_path / "ck" / "calibration.json").unlink()
    with pytest.raises(DataError, match="calibration.json: not found .*belong together"):
        load_calibration(tmp_path / "ck", 8)
    other = tmp_path / "wide"
    Calibration.fit(BETA, rank=4, text=_unit(10, 16, 1).float()).save(other)
    with pytest.raises(DataError, match="16-d, but the model embeds in 8 dimensions: it belongs to another model"):
        load_calibration(other, 8)
    rec = json.loads((other / "calibration.json").read_text())
    (other / "calibration.json").write_text(json.dumps({**rec, "beta": -1}))
    with pytest.raises(DataError, match="beta must be a positive number"):
        load_calibration(other, 16)


def test_a_model_whose_score_is_not_an_inner_product_refuses_a_calibration(tmp_path):
    torch.manual_seed(0)
    scan = create_model("scan_t2i_avg", img_dim=6, embed_dim=8, word_dim=4, vocab_size=12)
    scan.vocab = Vocab.build(["a dog"], min_count=1)
    scan.save(tmp_path / "scan")
    Calibration.fit(BETA, rank=4, text=_unit(10, 8, 1).float()).save(tmp_path / "scan")
    seal_checkpoint(tmp_path / "scan")  # a folder made so on purpose: its files are whole, the pairing is wrong
    with pytest.raises(DataError, match="calibration.json: model scan_t2i_avg takes no calibration"):
        load_model(tmp_path / "scan")
