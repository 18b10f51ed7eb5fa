"""experiments/scan_attention.py: each model's attention read as distributions, and the uniform form of
SCAN's and CAAN's attention that the --uniform ablation scores with."""

import numpy as np
import pytest
import torch

from tests.benchmark_scripts import load_script
from vlmatch import create_model


@pytest.fixture(scope="module")
def report():
    return load_script("scan_attention", "attention_report")


def test_caan_gives_one_distribution_over_regions_and_one_over_words(report):
    att = {"axis": "pair", "weights": np.outer([0.5, 0.5], [0.2, 0.3, 0.5]),
           "region_weights": np.array([0.5, 0.5]), "word_weights": np.array([0.2, 0.3, 0.5])}
    d = report._distributions(att)
    assert d["regions"].shape == (1, 2) and d["words"].shape == (1, 3)
    s = report._summary("regions", [d["regions"]])
    assert s["entropy"] == pytest.approx(1.0) and s["effective"] == pytest.approx(2.0)
    scan = report._distributions({"axis": "regions", "weights": np.full((4, 3), 0.25)})  # t-i: words' rows
    assert list(scan) == ["regions"] and scan["regions"].shape == (3, 4)


def test_caan_with_its_uniform_settings_scores_the_cosine_of_the_mean_region_and_word(report):
    torch.manual_seed(0)
    model = create_model("caan", img_dim=10, embed_dim=8, word_dim=6, attn_dim=4, vocab_size=20).eval()
    change = report.uniform_settings(model)
    assert change == {"inter": False, "intra": "none"}
    for k, v in change.items():
        setattr(model.cfg, k, v)
    feats, tokens, lengths = torch.randn(3, 5, 10), torch.tensor([[1, 2, 3], [4, 5, 0]]), torch.tensor([3, 2])
    with torch.no_grad():
        img, txt = model.encode_images(feats), model.encode_texts(tokens, lengths)
        got = model.score(img, txt)
        v = img.regions.mean(dim=1)
        u = torch.stack([txt.words[j, : lengths[j]].mean(dim=0) for j in range(2)])
        want = torch.nn.functional.normalize(v, dim=1) @ torch.nn.functional.normalize(u, dim=1).T
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_scan_is_made_uniform_by_a_zero_temperature(report):
    model = create_model("scan_t2i_avg", img_dim=10, embed_dim=8, word_dim=6, vocab_size=20)
    assert report.uniform_settings(model) == {"lambda_softmax": 0.0}
