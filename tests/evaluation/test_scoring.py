"""The engine fills the same matrix as one direct ``score`` call, whatever the block plan, compiled
or not, in one process or sharded over several."""

import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from vlmatch import create_model
from vlmatch.data.loaders import encode_captions, pad_tokens
from vlmatch.data.precomp import PrecompSplit
from vlmatch.data.vocab import Vocab
from vlmatch.evaluation.scoring import BlockPlan, encode_all_images, model_scores, shard_rows

ENGINE_MODELS = ["vsepp", "scan_t2i_lse", "scan_i2t_avg", "caan", "sman"]
COMPILE_MODELS = [*ENGINE_MODELS, "mtfn", "mmca"]  # every registered family


def _small_model(name, sp, vocab):
    torch.manual_seed(0)
    extra = {"attn_dim": 6} if name.startswith(("caan", "sman")) else {}
    if name == "mtfn":
        extra = {"rank": 3, "fusion_dim": 12}
    if name == "mmca":  # the packaged all-MiniLM-L6-v2 as its text encoder, small Transformer units
        extra = {"heads": 4, "cnn_filters": 8}
    return create_model(name, img_dim=sp.img_dim, embed_dim=16, word_dim=8, vocab_size=len(vocab), **extra).eval()


@pytest.mark.parametrize("name", ENGINE_MODELS)
@pytest.mark.parametrize("plan", [BlockPlan(7, 13), BlockPlan(200, 1000), None])
def test_engine_equals_direct_score(small_world, name, plan):
    sp = PrecompSplit(small_world, "test", max_images=40)
    vocab = Vocab.build(sp.captions, 1)
    model = _small_model(name, sp, vocab)
    got = model_scores(model, sp, vocab, plan=plan, progress=False)
    tokens, lengths = pad_tokens(encode_captions(sp, vocab))
    with torch.no_grad():
        want = model.score(model.encode_images(torch.from_numpy(np.array(sp.features))),
                           model.encode_texts(tokens, lengths)).numpy()
    np.testing.assert_allclose(got, want, atol=1e-5)


def test_block_plan_respects_budget():
    m = create_model("scan_t2i_avg")
    p = BlockPlan.for_budget(m, 5000, 25000, 36, 12, budget=2**30)
    assert p.images * p.captions * m.bytes_per_pair(36, 12) <= 2**30
    assert p.images > 1 and p.captions > 1


@pytest.mark.parametrize("n_rows,block,world", [(10, 3, 2), (200, 64, 3), (5, 8, 2), (7, 1, 7)])
def test_shards_are_whole_blocks_covering_every_row(n_rows, block, world):
    spans = [shard_rows(n_rows, block, r, world) for r in range(world)]
    assert spans[0][0] == 0 and spans[-1][1] == n_rows
    assert all(a[1] == b[0] for a, b in zip(spans, spans[1:], strict=False))  # contiguous, no overlap
    assert all(start % block == 0 for start, _ in spans)


def test_a_shard_encodes_its_rows_exactly_as_the_full_run(small_world):
    sp = PrecompSplit(small_world, "test")
    vocab = Vocab.build(sp.captions, 1)
    model = _small_model("caan", sp, vocab)
    full = encode_all_images(model, sp, batch_size=32, progress=False)
    part = encode_all_images(model, sp, batch_size=32, progress=False, rows=(48, 130))
    for name, t in part.tensors().items():
        assert torch.equal(t, getattr(full, name)[48:130]), name


@pytest.mark.slow
@pytest.mark.parametrize("name", COMPILE_MODELS)
def test_compiled_engine_equals_eager(small_world, name):
    """compile=True: one block shape (last partial blocks padded), scores equal to float rounding."""
    sp = PrecompSplit(small_world, "test", max_images=30)
    vocab = Vocab.build(sp.captions, 1)
    model = _small_model(name, sp, vocab)
    vocab = vocab if model.uses_vocab else None  # MMCA tokenises with its own WordPiece vocabulary
    plan = BlockPlan(8, 64)  # 30 images: a partial last image block; 150 captions: a partial last chunk
    eager = model_scores(model, sp, vocab, plan=plan, progress=False)
    torch._dynamo.reset()
    compiled = model_scores(model, sp, vocab, plan=plan, progress=False, compile=True)
    np.testing.assert_allclose(compiled, eager, atol=1e-5, rtol=0)


@pytest.mark.slow
def test_torchrun_two_processes_evaluate_bit_identical(small_world, tmp_path):
    """`vlmatch evaluate` under torchrun: 2 gloo ranks score their image blocks, rank 0 gathers the
    same matrix, to the bit, as one process, and prints the table once."""
    sp = PrecompSplit(small_world, "test", max_images=60)
    vocab = Vocab.build(PrecompSplit(small_world, "train").captions, 1)
    model = _small_model("caan", sp, vocab)
    model.vocab = vocab
    model.save(tmp_path / "ck")
    budget_mb = 1.0
    plan = BlockPlan.for_budget(model, 60, 300, sp.n_regions, max(len(t) for t in encode_captions(sp, model)),
                                int(budget_mb * 2**20))
    assert plan.images < 30  # both ranks get image blocks
    torch.set_num_threads(1)  # as each torchrun rank runs
    try:
        want = model_scores(model, sp, progress=False, budget=int(budget_mb * 2**20))
    finally:
        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", os.cpu_count())))
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "vlmatch.cli",
         "evaluate", "--checkpoint", str(tmp_path / "ck"), "--data", str(small_world), "--max-images", "60",
         "--save-sims", str(tmp_path / "s.npy"), "--no-progress", "--budget-mb", str(budget_mb)],
        capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = np.load(tmp_path / "s.npy")
    assert got.shape == want.shape == (60, 300)
    assert np.array_equal(got, want)
    assert proc.stdout.count("rsum") == 1  # rank 0 alone prints
