"""vlmatch_lab.caches: the Flickr8k feature caches and the run folders, under the rooms' one cache root."""

from vlmatch_lab.caches import BACKBONE, features_dir, features_of, runs_dir


def test_feature_caches_and_run_folders_live_under_the_cache_root(monkeypatch, tmp_path):
    monkeypatch.setenv("VLMATCH_CACHE", str(tmp_path))
    assert features_dir() == tmp_path / "flickr8k-efficientnet-lite0" and BACKBONE == "efficientnet-lite0"
    assert features_dir(320, "efficientnet-lite2") == tmp_path / "flickr8k-efficientnet-lite2-320"
    assert features_dir(224, "efficientnet-lite2") == tmp_path / "flickr8k-efficientnet-lite2"  # its own size: no suffix
    assert runs_dir() == tmp_path / "runs"


def test_a_checkpoint_that_names_no_backbone_reads_the_studys_features(monkeypatch, tmp_path):
    monkeypatch.setenv("VLMATCH_CACHE", str(tmp_path))
    (tmp_path / "ck").mkdir()
    assert features_of(tmp_path / "ck") == features_dir()
