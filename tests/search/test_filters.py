"""Filters keep the ranking exact: each filtered search returns the brute-force filter of the exhaustive
ranking (same top k), on the folder backend (flat, and HNSW/IVF through FAISS's id selector) and on
milvus-lite; the photos' EXIF comes back with each result, through Python, the CLI and the HTTP API."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from fastapi.testclient import TestClient

import vlmatch
from vlmatch.cli import main
from vlmatch.features import backbones
from vlmatch.search import filters as F
from vlmatch.search.build import build_index, update_index
from vlmatch.search.filters import Where, top_k_of
from vlmatch.search.service import IndexBackend, create_app

from .exif_library import make_library, save_tiny_models
from .tiny import Tiny32

FILTERS = [
    {"after": "2021-03-01", "before": "2021-10-31"},
    {"before": "2021-06-30"},
    {"after": "2022-01-01T00:00:00"},
    {"camera": "canon"},
    {"camera": "NIKON d7"},
    {"under": "2022/summer"},
    {"under": "misc/"},
    {"near": (48.86, 2.35, 10)},
    {"near": "-33.87,151.21,5"},
    {"after": "2021-01-01", "camera": "iphone", "under": "2021"},
    {"camera": "no such camera"},
]
QUERY = "a dog on the grass"


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    root = tmp_path_factory.mktemp("exif_lib")
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(backbones.BACKBONES, "tiny32", Tiny32)
        ck = save_tiny_models(root / "ck")
        photos = make_library(root / "photos")
        opts = dict(images=photos, retriever_ckpt=ck["retriever"], backbone="tiny32", progress=False, batch_size=8)
        build_index(root / "flat", ck["model"], ann="flat", **opts)
        build_index(root / "hnsw", ck["model"], ann="hnsw", **opts)
        build_index(root / "ivf", ck["model"], ann="ivf", nlist=4, **opts)
        yield {"root": root, "ck": ck, "photos": photos, "opts": opts}


def _expected(idx, where: dict, k: int):
    """The brute-force filter of the exhaustive ranking."""
    w = Where.of(where)
    every = idx.search(QUERY, k=len(idx), candidates=len(idx))
    rows = {it["id"]: it for it in idx.items}
    return [r for r in every if w.matches(rows[r.id])][:k], sum(w.matches(it) for it in idx.items)


def test_rows_and_results_carry_date_camera_gps_and_displayed_size(lib):
    idx = vlmatch.Index.open(lib["root"] / "flat")
    rows = {it["rel"]: it for it in idx.items}
    assert rows["2021/p00.jpg"]["taken"] == "2021-01-01T00:00:00+02:00"
    assert rows["2021/p00.jpg"]["camera"] == "Canon EOS 5D" and rows["2021/p00.jpg"]["gps"] == [48.8566, 2.3522]
    assert rows["misc/p05.jpg"].get("taken") is None and "notes" not in rows["misc/p05.jpg"]  # no date: none
    broken = rows["2022/summer/p04.jpg"]  # DateTimeOriginal "2021:13:45 99:00:00"
    assert "taken" not in broken and any("not a possible date" in n for n in broken["notes"])  # and still indexed
    hit = idx.search(QUERY, k=len(idx), candidates=len(idx))
    by_id = {it["id"]: it for it in idx.items}
    for r in hit:
        it = by_id[r.id]
        assert (r.taken, r.camera, r.gps, r.size) == (it.get("taken"), it.get("camera"), it.get("gps"), it["pixels"])
    d = next(r for r in hit if r.taken and r.gps).to_dict()
    assert {"taken", "camera", "gps", "size"} <= set(d)


@pytest.mark.parametrize("where", FILTERS)
def test_each_filter_returns_the_filtered_exhaustive_top_k(lib, where):
    idx = vlmatch.Index.open(lib["root"] / "flat")
    want, n_match = _expected(idx, where, 4)
    got = idx.search(QUERY, k=4, candidates=max(4, n_match), where=where)
    assert [r.id for r in got] == [r.id for r in want]
    np.testing.assert_allclose([r.score for r in got], [r.score for r in want], rtol=1e-5)
    assert len(got) == min(4, n_match)
    # a filter that keeps more photos than the candidates: stage 1's own top among the matching photos
    s1 = idx.search(QUERY, k=1, candidates=1, where=where)
    if n_match:
        w = Where.of(where)
        vec = idx.encode_queries([QUERY])[1]
        rows = np.flatnonzero([w.matches(it) for it in idx.items])
        best = int(top_k_of(vec, idx.images.stage1.vectors, rows, 1)[1][0, 0])
        assert s1[0].id == idx.items[best]["id"]


@pytest.mark.parametrize("kind, through", [("hnsw", "graph"), ("ivf", "lists"), ("hnsw", "flat storage"),
                                           ("ivf", "gathered rows")])
@pytest.mark.parametrize("where", FILTERS[:8])
def test_the_faiss_id_selector_gives_the_brute_force_stage1(lib, kind, through, where, monkeypatch):
    if through in ("graph", "lists"):
        monkeypatch.setattr(F, "EXACT_BELOW", 0)  # through the ANN index with the selector, not the exact path
    idx = vlmatch.Index.open(lib["root"] / kind)
    if kind == "ivf":
        idx.images.stage1.set_params({"nprobe": 4})  # every list: the IVF search is exact here
    q = idx.encode_queries([QUERY, "a cat on a sofa"])[1]
    w = Where.of(where)
    mask = np.array([w.matches(it) for it in idx.items])
    k = 3
    assert mask.sum() > k  # the selector path, not the few-matches path
    s, rows = idx.images.search(q, k, where=w)
    want_s, want_rows = top_k_of(q, idx.images.stage1.vectors, np.flatnonzero(mask), k)
    assert rows.tolist() == want_rows.tolist()
    np.testing.assert_allclose(s, want_s, rtol=1e-5)


def test_date_bounds_are_inclusive_and_undated_photos_never_pass():
    row = {"taken": "2021-06-30T23:59:59+09:00", "rel": "a/b.jpg"}
    assert Where(before="2021-06-30").matches(row) and Where(after="2021-06-30").matches(row)  # the photo's clock
    assert not Where(after="2021-07-01").matches(row) and Where(before="2021-06-30T23:59:59").matches(row)
    assert not Where(before="2021-06-30T23:59:58").matches(row)
    assert not Where(before="2100-01-01").matches({"rel": "x.jpg"})  # no date: out of every date filter
    assert Where(under="a").matches(row) and not Where(under="a/b").matches(row) and not Where(under="").active
    assert not Where(under="a/").matches({"rel": "ab/c.jpg"})
    assert Where(near=(48.8566, 2.3522, 6)).matches({"gps": [48.90, 2.40]})  # 6.1 km apart: just in
    assert not Where(near=(48.8566, 2.3522, 6)).matches({"gps": [48.95, 2.40]})
    assert not Where(near=(0, 0, 20000)).matches({"rel": "x"})


@pytest.mark.parametrize("where, words", [
    ({"after": "2021-31-01"}, "after '2021-31-01': expected a date YYYY-MM-DD"),
    ({"after": "2022-01-01", "before": "2021-01-01"}, "later than before"),
    ({"near": "48,2"}, "expected LAT,LON,KM"), ({"near": "91,0,1"}, "latitude in -90..90"),
    ({"under": "../x"}, "relative to it"), ({"color": "red"}, "unknown filter"),
])
def test_bad_filters_are_one_clear_line(where, words):
    with pytest.raises(vlmatch.errors.ConfigError, match=words.replace("(", r"\(").replace(".", r"\.")):
        Where.of(where)


def test_update_reads_the_exif_of_new_photos_and_date_from_mtime_dates_the_rest(lib, tmp_path, monkeypatch):
    from tests.features.photo_exif import save_photo

    monkeypatch.setitem(backbones.BACKBONES, "tiny32", Tiny32)
    photos = tmp_path / "photos"
    save_photo(photos / "dated.jpg", taken="2020:02:02 02:02:02", make="Fuji", model="X100")
    save_photo(photos / "undated.jpg", seed=1)
    os.utime(photos / "undated.jpg", (1_600_000_000, 1_600_000_000))
    opts = {**lib["opts"], "images": photos}
    build_index(tmp_path / "plain", lib["ck"]["model"], **opts)
    build_index(tmp_path / "mtime", lib["ck"]["model"], date_from_mtime=True, **opts)
    plain = {it["rel"]: it for it in vlmatch.Index.open(tmp_path / "plain").items}
    dated = {it["rel"]: it for it in vlmatch.Index.open(tmp_path / "mtime").items}
    assert "taken" not in plain["undated.jpg"] and plain["dated.jpg"]["taken"] == "2020-02-02T02:02:02"
    assert dated["undated.jpg"]["taken"].startswith("2020-09-1") and dated["undated.jpg"]["taken_from"] == "mtime"
    assert dated["dated.jpg"]["taken"] == "2020-02-02T02:02:02" and "taken_from" not in dated["dated.jpg"]
    save_photo(photos / "new.jpg", seed=2, taken="2024:01:02 03:04:05", gps=(10.5, -20.25))
    update_index(tmp_path / "plain", progress=False)
    idx = vlmatch.Index.open(tmp_path / "plain")
    new = {it["rel"]: it for it in idx.items}["new.jpg"]
    assert new["taken"] == "2024-01-02T03:04:05" and new["gps"] == pytest.approx([10.5, -20.25])
    assert [r.path.endswith("new.jpg") for r in idx.search(QUERY, k=3, where={"after": "2023-01-01"})] == [True]


def test_cli_filters_table_and_json(lib, tmp_path, capsys):
    out = tmp_path / "r.json"
    assert main(["search", str(lib["root"] / "flat"), QUERY, "-k", "3", "--after", "2021-03-01", "--before",
                 "2021-10-31", "--camera", "canon", "--json", str(out)]) == 0
    table = capsys.readouterr().out
    assert "taken" in table.splitlines()[0]
    body = json.loads(out.read_text())
    assert body["where"] == {"after": "2021-03-01", "before": "2021-10-31", "camera": "canon"}
    idx = vlmatch.Index.open(lib["root"] / "flat")
    want, _ = _expected(idx, body["where"], 3)
    assert [r["id"] for r in body["results"]] == [r.id for r in want]
    for r in body["results"]:
        assert "2021-03-01" <= r["taken"][:10] <= "2021-10-31" and "Canon" in r["camera"]
        assert r["taken"][:16].replace("T", " ") in table and len(r["size"]) == 2
    assert main(["search", str(lib["root"] / "flat"), QUERY, "--near", "1,2"]) == 2
    assert "vlmatch: error: --near '1,2': expected LAT,LON,KM" in capsys.readouterr().err


def test_http_query_parameters_filter_as_python_does(lib):
    idx = vlmatch.Index.open(lib["root"] / "flat")
    with TestClient(create_app(IndexBackend(idx))) as c:
        body = c.get("/search", params={"q": QUERY, "k": 5, "after": "2021-03-01", "before": "2021-10-31",
                                        "under": "2021"}).json()
        want = idx.search(QUERY, k=5, where={"after": "2021-03-01", "before": "2021-10-31", "under": "2021"})
        assert [r["id"] for r in body["results"]] == [r.id for r in want] and want
        assert all(r["path"].startswith("2021/") and r["taken"] and len(r["size"]) == 2 for r in body["results"])
        near = c.post("/search", json={"text": QUERY, "k": 5, "near": [48.86, 2.35, 10]}).json()
        assert [r["id"] for r in near["results"]] == [r.id for r in idx.search(QUERY, k=5, where={"near": "48.86,2.35,10"})]
        assert all(abs(r["gps"][0] - 48.87) < 0.1 for r in near["results"])
        bad = c.get("/search", params={"q": QUERY, "before": "tomorrow"})
        assert bad.status_code == 400 and bad.json()["error"] == "bad_filter" and "before" in bad.json()["detail"]




@pytest.fixture(scope="module")
def milvus(lib):
    pytest.importorskip("milvus_lite")
    from vlmatch.search.backends.base import MilvusLocation
    from vlmatch.search.build import build_index

    loc = MilvusLocation(str(lib["root"] / "m.db"), "photos")
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(backbones.BACKBONES, "tiny32", Tiny32)
        build_index(loc, lib["ck"]["model"], **lib["opts"])
    return vlmatch.Index.open(milvus_uri=loc.uri, collection=loc.collection)


@pytest.mark.slow  # a Milvus Lite build
@pytest.mark.parametrize("where", FILTERS + [{"camera": 'can"on'}, {"under": "2022/summer", "near": (48.9, 2.4, 1)}])
def test_milvus_filters_give_the_folder_results(lib, milvus, where):
    folder = vlmatch.Index.open(lib["root"] / "flat")
    want, n_match = _expected(folder, where, 4)
    for cand in (max(4, n_match), 4):  # all the matches re-scored; only four of them (Milvus's filtered search)
        got = milvus.search(QUERY, k=4, candidates=cand, where=where)
        ref = folder.search(QUERY, k=4, candidates=cand, where=where)
        assert [r.id for r in got] == [r.id for r in ref]
        np.testing.assert_allclose([r.score for r in got], [r.score for r in ref], atol=1e-4)
        assert [(r.taken, r.camera, r.gps, r.size) for r in got] == [(r.taken, r.camera, r.gps, r.size) for r in ref]
    assert [r.id for r in milvus.search(QUERY, k=4, candidates=max(4, n_match), where=where)] == [r.id for r in want]


@pytest.mark.slow  # a Milvus Lite build
@pytest.mark.parametrize("where", [FILTERS[0], FILTERS[3], FILTERS[7]])
def test_milvus_filters_read_the_json_rows_of_a_collection_without_the_scalar_fields(lib, milvus, where):
    folder = vlmatch.Index.open(lib["root"] / "flat")
    milvus.images.scalars = False  # as a collection written before the fields were added reads
    try:
        got = milvus.search(QUERY, k=4, candidates=4, where=where)
    finally:
        milvus.images.scalars = None
    assert [r.id for r in got] == [r.id for r in folder.search(QUERY, k=4, candidates=4, where=where)]


def test_cli_date_from_mtime_on_build_and_its_refusal_on_milvus(lib, tmp_path, monkeypatch, capsys):
    from tests.features.photo_exif import save_photo

    from .tiny import build_args

    monkeypatch.setitem(backbones.BACKBONES, "tiny32", Tiny32)
    photos = tmp_path / "photos"
    save_photo(photos / "undated.jpg")
    os.utime(photos / "undated.jpg", (1_500_000_000, 1_500_000_000))
    assert main(build_args(lib["ck"]["model"], photos, tmp_path / "idx", "--date-from-mtime",
                           retriever=lib["ck"]["retriever"])) == 0
    idx = vlmatch.Index.open(tmp_path / "idx")
    assert idx.items[0]["taken"].startswith("2017-07-1") and idx.manifest["source"]["date_from_mtime"] is True
    assert [r.id for r in idx.search(QUERY, k=1, where={"before": "2017-12-31"})] == [idx.items[0]["id"]]
    capsys.readouterr()
    assert main(["index", "build", "--model", str(lib["ck"]["model"]), "--images", str(photos), "--backend", "milvus",
                 "--milvus-uri", str(tmp_path / "m.db"), "--collection", "c", "--date-from-mtime"]) == 2
    assert "--date-from-mtime is for the folder backend" in capsys.readouterr().err
