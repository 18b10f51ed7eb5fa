"""The Flickr30k Entities parser, on real files from the data folder ($VLMATCH_DATA, default ../shared beside the
checkout) and on hand-written damaged ones."""


import pytest

from vlmatch.data.entities import EntitiesDir, in_box, parse_sentence, photo_id, read_annotation, read_sentences
from vlmatch.errors import DataError
from vlmatch_lab.paths import data_root

ENTITIES = data_root(check=False) / "flickr30k_entities"
needs_shared = pytest.mark.skipif(not ENTITIES.is_dir(), reason=f"no {ENTITIES} ($VLMATCH_DATA/flickr30k_entities)")


def test_parse_sentence_spans_types_and_chain_zero():
    s = parse_sentence("[/EN#98/animals A black dog] and [/EN#682/animals/scene a lab] playing with "
                       "[/EN#0/notvisual each other] .")
    assert s.text == "A black dog and a lab playing with each other ."
    assert [(p.text, p.chain, p.types) for p in s.phrases] == [
        ("A black dog", "98", ("animals",)), ("a lab", "682", ("animals", "scene")), ("each other", "0", ("notvisual",))]
    for p in s.phrases:
        assert s.text[p.start:p.end] == p.text


def test_malformed_mark_names_the_line():
    with pytest.raises(DataError, match="malformed phrase mark"):
        parse_sentence("[/EN#12 a dog", where="x.txt: line 3")


@needs_shared
def test_real_files_chains_several_boxes_nobox_and_scene():
    sentences = read_sentences(ENTITIES / "Sentences" / "1053804096.txt")
    assert len(sentences) == 5
    assert [p.text for p in sentences[0].phrases] == ["a girl", "pigtails", "the ocean", "the beach"]
    ann = read_annotation(ENTITIES / "Annotations" / "1053804096.xml")
    assert len(ann.boxes["1383"]) == 2  # "pigtails": one box per pigtail
    assert "1387" in ann.scene and "1387" in ann.nobox and "1387" not in ann.boxes  # the beach: scene, no box
    ents = EntitiesDir(ENTITIES)
    _, _, grounded = ents.grounded("1053804096_abcdef.jpg")
    assert {g.phrase.chain for g in grounded} <= set(ann.boxes)
    assert all(g.boxes for g in grounded) and not any(g.phrase.chain == "1387" for g in grounded)
    # chain 0 ("each other") is never grounded
    _, _, grounded = ents.grounded("1001773457_577c3a7d70.jpg")
    assert grounded and all(g.phrase.chain != "0" for g in grounded)


def test_annotation_errors_name_the_file(tmp_path):
    bad = tmp_path / "1.xml"
    bad.write_text("<annotation><size><width>x</width></size></annotation>")
    with pytest.raises(DataError, match=r"1\.xml.*<width>"):
        read_annotation(bad)
    bad.write_text("<annotation><size>")
    with pytest.raises(DataError, match="not well-formed XML"):
        read_annotation(bad)
    with pytest.raises(DataError, match="no Annotations/ folder"):
        EntitiesDir(tmp_path)


def test_box_geometry_and_ids():
    assert photo_id("1000268201_693b08cb0e.jpg") == "1000268201"
    assert in_box(0.0, 0.0, (1, 1, 1, 1)) and in_box(1.0, 1.0, (1, 1, 1, 1))  # pixel 1 covers [0, 1]
    assert not in_box(1.01, 0.5, (1, 1, 1, 1))
