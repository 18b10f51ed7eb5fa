"""End to end on real Flickr8k images (when $VLMATCH_DATA/flickr8k exists, default ../shared/flickr8k): extract a few dozen
images, train a few steps, evaluate. Checks the pipeline and shapes, not accuracy."""

import json

import pytest

from vlmatch.cli import main
from vlmatch_lab.paths import data_root

SHARED = data_root(check=False) / "flickr8k"

pytestmark = pytest.mark.skipif(not (SHARED / "dataset_flickr8k.json").is_file(),
                                reason=f"{SHARED} not present")


@pytest.mark.slow  # a training
def test_images_to_trained_and_evaluated_model(tmp_path, capsys):
    pytest.importorskip("efficientnet_lite_pytorch")
    feats = tmp_path / "feats"
    assert main(["features", "extract", "--images", str(SHARED / "images"), "--annotations",
                 str(SHARED / "dataset_flickr8k.json"), "--out", str(feats), "--limit", "24", "--dtype", "float16",
                 "--no-progress"]) == 0
    run = tmp_path / "run"
    assert main(["train", "--config", "scan_t2i_avg_f8k", "--run-dir", str(run), "--no-progress",
                 "--set", f"data.path={feats}", "--set", "model.embed_dim=32", "--set", "model.word_dim=16",
                 "--set", "train.epochs=1", "--set", "train.batch_size=8", "--set", "data.min_word_count=1"]) == 0
    assert main(["evaluate", "--checkpoint", str(run / "best"), "--data", str(feats), "--split", "dev",
                 "--json", str(tmp_path / "r.json"), "--no-progress"]) == 0
    r = json.loads((tmp_path / "r.json").read_text())
    assert r["n_images"] == 24 and r["n_captions"] == 120 and 0 <= r["rsum"] <= 600
