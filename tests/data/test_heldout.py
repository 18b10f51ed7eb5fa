"""Concept-held-out training data (vlmatch.data.heldout, data.exclude_words)."""

import numpy as np
import pytest

from vlmatch.data.heldout import WordSet, images_naming
from vlmatch.data.precomp import PrecompSplit
from vlmatch.errors import ConfigError
from vlmatch.training.loop import hold_out


def test_a_word_matches_its_forms_and_whole_tokens_only():
    ws = WordSet(["cat", "bus", "party", "man", "bicycl*", "leaf"])
    assert ws.names("Two cats and a kitten") == {"cat"}
    assert ws.names("the buses") == {"bus"}
    assert ws.names("parties at night") == {"party"}
    assert ws.names("three men") == {"man"}
    assert ws.names("a bicyclist rides") == {"bicycl*"}
    assert ws.names("autumn leaves") == {"leaf"}
    assert ws.names("he catches a scattered ball") == set()  # not inside other words


def test_images_naming_reads_every_caption_of_an_image():
    caps = ["a dog", "a dog runs", "a cat", "grass", "a man", "a man walks"]
    assert images_naming(caps, 2, ["cat"]) == [set(), {"cat"}, set()]


def _precomp(tmp_path, n=4, per=2):
    np.save(tmp_path / "train_ims.npy", np.arange(n * 3 * 2, dtype=np.float32).reshape(n, 3, 2))
    caps = [f"photo {i} caption {j}" + (" with a horse" if i == 1 and j == 0 else "") for i in range(n)
            for j in range(per)]
    (tmp_path / "train_caps.txt").write_text("\n".join(caps) + "\n")
    (tmp_path / "train_ids.txt").write_text("\n".join(f"{i}.jpg" for i in range(n)) + "\n")
    return PrecompSplit(tmp_path, "train")


def test_hold_out_drops_the_images_and_all_their_captions(tmp_path):
    split = _precomp(tmp_path)
    hold_out(split, ["horse*"], log=False)
    assert split.n_images == 3 and split.ids == ["0.jpg", "2.jpg", "3.jpg"]
    assert split.captions[2:4] == ["photo 2 caption 0", "photo 2 caption 1"]
    assert np.array_equal(split.image(1), np.arange(12, 18, dtype=np.float32).reshape(3, 2))  # image 2's features


def test_hold_out_that_leaves_nothing_is_refused(tmp_path):
    split = _precomp(tmp_path)
    with pytest.raises(ConfigError, match="leaves no train image"):
        hold_out(split, ["photo"], log=False)
