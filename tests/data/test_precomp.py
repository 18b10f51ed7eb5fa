"""The precomp loader and its bad-input errors: each names the file and the problem."""

import numpy as np
import pytest

from vlmatch.data.loaders import PairDataset, collate_pairs
from vlmatch.data.precomp import PrecompSplit, available_splits
from vlmatch.data.vocab import Vocab
from vlmatch.errors import DataError

from ..conftest import write_precomp

CAPS = ["a dog runs", "the dog is brown", "a dog", "dog on grass", "brown dog",
        "a cat sleeps", "the cat", "a grey cat", "cat on a sofa", "sleeping cat"]


def test_loads_memory_mapped_with_captions_and_ids(tmp_path):
    write_precomp(tmp_path, "train", np.ones((2, 3, 4)), CAPS, ids=["x", "y"])
    sp = PrecompSplit(tmp_path, "train")
    assert isinstance(sp.features, np.memmap)
    assert (sp.n_images, sp.n_regions, sp.img_dim, sp.per_image) == (2, 3, 4, 5)
    assert sp.ids == ["x", "y"] and sp.image_of_caption(7) == 1
    batch = collate_pairs([PairDataset(sp, Vocab.build(CAPS, 1))[j] for j in (0, 6)])
    assert batch["features"].shape == (2, 3, 4) and batch["image_index"].tolist() == [0, 1]
    assert batch["tokens"][0, 0] == 1 and batch["lengths"].tolist() == [5, 4]  # <start> ... <end>


def test_dev_truncation_keeps_first_images_and_their_captions(tmp_path):
    write_precomp(tmp_path, "dev", np.arange(24, dtype=float).reshape(2, 3, 4), CAPS)
    sp = PrecompSplit(tmp_path, "dev", max_images=1)
    assert sp.n_images == 1 and sp.captions == CAPS[:5]


@pytest.mark.parametrize("case,pattern", [
    ("missing_features", r"train_ims\.npy: feature file not found"),
    ("missing_captions", r"train_caps\.txt: caption file not found"),
    ("rank2", r"train_ims\.npy: features must have rank 3"),
    ("not_multiple", r"train_caps\.txt: 9 captions is not a multiple of the 2 images"),
    ("empty_caption", r"train_caps\.txt: line 3 is an empty caption"),
    ("non_utf8", r"train_caps\.txt: line 2 is not valid UTF-8"),
    ("corrupt_npy", r"train_ims\.npy: not a readable \.npy"),
    ("int_features", r"train_ims\.npy: features must be floating point"),
])
def test_bad_input_names_file_and_problem(tmp_path, case, pattern):
    feats, caps = np.ones((2, 3, 4), dtype=np.float32), list(CAPS)
    write_precomp(tmp_path, "train", feats, caps)
    if case == "missing_features":
        (tmp_path / "train_ims.npy").unlink()
    elif case == "missing_captions":
        (tmp_path / "train_caps.txt").unlink()
    elif case == "rank2":
        np.save(tmp_path / "train_ims.npy", np.ones((2, 4), dtype=np.float32))
    elif case == "not_multiple":
        (tmp_path / "train_caps.txt").write_text("\n".join(caps[:9]) + "\n")
    elif case == "empty_caption":
        caps[2] = "   "
        (tmp_path / "train_caps.txt").write_text("\n".join(caps) + "\n")
    elif case == "non_utf8":
        (tmp_path / "train_caps.txt").write_bytes(b"a dog\n\xff\xfe bad\n" + "\n".join(caps[2:]).encode())
    elif case == "corrupt_npy":
        (tmp_path / "train_ims.npy").write_bytes(b"\x93NUMPY garbage")
    elif case == "int_features":
        np.save(tmp_path / "train_ims.npy", np.ones((2, 3, 4), dtype=np.int64))
    with pytest.raises(DataError, match=pattern):
        PrecompSplit(tmp_path, "train")


def test_nan_features_are_reported_with_the_image_index(tmp_path):
    feats = np.ones((2, 3, 4), dtype=np.float32)
    feats[1, 2, 0] = np.inf
    write_precomp(tmp_path, "train", feats, CAPS)
    sp = PrecompSplit(tmp_path, "train")
    with pytest.raises(DataError, match=r"train_ims\.npy: image 1 has NaN or inf"):
        sp.check_all_finite()
    with pytest.raises(DataError, match=r"image 1 has NaN"):
        sp.image(1)


def test_pairs_show_the_mirror_view_by_chance_per_epoch_and_never_for_a_side(tmp_path):
    caps = list(CAPS)
    caps[3] = "dog on the left"  # names a side: always the photo
    feats = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    write_precomp(tmp_path, "train", feats, caps)
    np.save(tmp_path / "train_mirror_ims.npy", -feats)
    sp = PrecompSplit(tmp_path, "train")
    assert available_splits(tmp_path) == ["train"]  # the mirror views are not a split of their own
    vocab = Vocab.build(caps, 1)
    assert not PairDataset(sp, vocab).mirrored.any()  # off by default
    ds = PairDataset(sp, vocab, mirror=0.5)
    seen = []
    for epoch in range(8):
        ds.set_epoch(3, epoch)
        seen.append(ds.mirrored.copy())
        batch = collate_pairs([ds[j] for j in range(10)])
        assert batch["mirrored"].tolist() == ds.mirrored.tolist()
        for j in range(10):  # a mirrored row carries the mirror file's features
            want = -feats[j // 5] if ds.mirrored[j] else feats[j // 5]
            np.testing.assert_array_equal(batch["features"][j].numpy(), want)
    seen = np.array(seen)
    assert not seen[:, 3].any() and 0.25 < seen.mean() < 0.75  # the side caption never; the others about half
    ds.set_epoch(3, 5)
    assert np.array_equal(ds.mirrored, seen[5])  # a pure function of (seed, epoch): a resume replays it
    assert collate_pairs([PairDataset(sp, vocab)[0]])["mirrored"].tolist() == [False]


def test_a_missing_or_mismatched_mirror_file_is_named_before_training(tmp_path):
    write_precomp(tmp_path, "train", np.ones((2, 3, 4)), CAPS)
    sp = PrecompSplit(tmp_path, "train")
    with pytest.raises(DataError, match=r"train_mirror_ims\.npy: mirror-view features not found"):
        PairDataset(sp, Vocab.build(CAPS, 1), mirror=0.5)
    np.save(tmp_path / "train_mirror_ims.npy", np.ones((2, 4, 4)))
    with pytest.raises(DataError, match=r"train_mirror_ims\.npy: shape \(2, 4, 4\) does not match"):
        PairDataset(PrecompSplit(tmp_path, "train"), Vocab.build(CAPS, 1), mirror=0.5)
