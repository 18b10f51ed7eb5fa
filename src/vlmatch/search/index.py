"""``vlmatch.Index``: open an index and search it in two stages.

Stage 1 ranks the whole collection by the inner product of global vectors (FAISS or Milvus); stage 2 re-scores each
query's top ``candidates`` with the model's own ``score`` (:func:`vlmatch.evaluation.scoring.score_blocks`, as
evaluation does), or, for a model whose score is that inner product (``MatchingModel.score_is_global``), keeps stage
1's exact scores. ``candidates >= len(index)`` is the exhaustive ranking.

    idx = vlmatch.Index.open("my_index")
    for r in idx.search("a dog runs on the beach", k=10):
        print(r.rank, r.score, r.path)
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..errors import ConfigError, DataError, VlmatchError
from ..evaluation.scoring import score_blocks
from ..models.base import ImageEncoding, MatchingModel, TextEncoding
from .backends.base import CollectionBackend, MilvusLocation
from .backends.folder import FolderCollection, manifest_stamp, open_parts, reading
from .encode import Stage1Source, index_models, template
from .explained import score_parts, shows_line
from .filters import Where
from .hits import DEFAULT_CANDIDATES, SearchHit, shows_text, with_relevance  # noqa: F401  (SearchHit: its home was here)
from .hits import ranked as _ranked
from .hits import sizes as _sizes
from .library.trust import PhotoRoot
from .open_vocab import OpenVocab, check_pins

SearchResult = SearchHit  # its name before 0.2, kept for one release


class Index:
    """An index folder opened for search (see :mod:`vlmatch.search.build` for its layout)."""

    def __init__(self, root, manifest: dict, model: MatchingModel, retriever: MatchingModel | None = None, *,
                 device="cpu", parts: dict | None = None, collections: dict[str, CollectionBackend] | None = None):
        self.root = root if isinstance(root, MilvusLocation) else Path(root)
        self.manifest = manifest
        self.model = model.eval()
        self.retriever = None if retriever is None else retriever.eval()
        self.device = torch.device(device)
        self.stage1_source = Stage1Source(self.model, self.retriever, OpenVocab.from_manifest(manifest))
        check_pins(self.stage1_source.open_vocab, manifest, self.root)  # else old photo columns pair with new queries
        self.n_regions = (manifest.get("dims") or {}).get("regions") or 1
        colls = manifest.get("collections", {})
        # the folder of each part (opening resolves them: see vlmatch.search.backends.folder)
        self.parts = parts = parts or {}
        # collections opened by another backend (vlmatch.search.backends.milvus.collection), else the folder's
        self.images, self.captions = (collections or {}).get("images"), (collections or {}).get("captions")
        for name in colls if collections is None else ():
            setattr(self, name, FolderCollection(parts.get(name, self.root / name), colls[name],
                                                 template(self.model, name, self.n_regions)))
        self._backbone = None
        self._shipped_explainer: _ShippedExplainer | bool | None = None  # None: not looked up; False: none applies
        self.last_timings: dict[str, float] = {}
        # stage 2's ranking score: the model's own, or the mean of it and the retriever's (= stage 1's exact
        # inner product of the retriever's unit vectors); indexes from before the option rank by the model's
        self.score_mode = manifest.get("score", "model")
        # stage 1 holds the model's own vectors and its score is their inner product: stage 1's scores are final,
        # and stage 2 (fetching the candidates' encodings to score them again) would only repeat them in float16
        self.stage1_is_score = (self.retriever is None and self.score_mode == "model"
                                and self.model.score_is_global())
        self.photo_root = PhotoRoot(manifest, self.root)  # a row's file must lie in it (vlmatch.search.library.trust)

    # --- opening ---------------------------------------------------------------------------
    @classmethod
    def open(cls, path=None, device="cpu", lean_queries: bool = True, *, milvus_uri: str | None = None,
             collection: str | None = None, model=None, retriever=None) -> Index:
        """Open an index folder written by ``vlmatch index build``, every part checked against the manifest
        (:mod:`vlmatch.search.backends.folder`), or a Milvus index, ``Index.open(milvus_uri=URI, collection=NAME)``
        (its models: the checkpoints it records, or ``model`` / ``retriever`` folders, checked against the digests).
        ``lean_queries``: prepare the lean text forward (:func:`vlmatch.encoders.hf.for_queries`); False for one query."""
        if milvus_uri is not None or collection is not None:
            if path is not None:
                raise ConfigError("open an index folder or a Milvus collection, not both")
            from .backends.milvus.collection import open_milvus

            loc = MilvusLocation(milvus_uri or "", collection or "")
            manifest, ckpts, colls = open_milvus(loc, model, retriever)
            with torch.no_grad():
                idx = cls(loc, manifest, *_models(ckpts, device, lean_queries), device=device, parts=ckpts, collections={})
                idx.images, idx.captions = (colls(name, idx.model, idx.n_regions) for name in ("images", "captions"))
                return idx
        if path is None:
            raise ConfigError("Index.open needs an index folder, or milvus_uri= and collection=")
        path = Path(path)
        for tries_left in (2, 1, 0):
            stamp = manifest_stamp(path)
            try:
                # one version, whole: a writer swaps parts in place only while no reader is opening
                with reading(path), torch.no_grad():
                    manifest, parts = open_parts(path)
                    return cls(path, manifest, *_models(parts, device, lean_queries), device=device, parts=parts)
            except (DataError, OSError):
                if not tries_left or manifest_stamp(path) == stamp:
                    raise
                # a build or update committed while this was opening (its old versions are gone): open the new index

    # --- the table -------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.images) if self.images is not None else 0

    @property
    def items(self) -> list[dict]:
        """The image table in row order: ``{"id", "path", ...}`` per image."""
        return self._need("images").items

    def path_of(self, item_id: int) -> str:
        """The file path of the image with id ``item_id``."""
        coll, key = self._key(item_id)
        return self.photo_root.path(coll.items_of([key])[0])

    def _key(self, item_id: int) -> tuple[CollectionBackend, object]:
        """The image collection and its key of the image with id ``item_id``."""
        coll = self._need("images")
        key = coll.key_of(item_id)
        if key is None:
            raise VlmatchError(f"no image with id {item_id} in {self.root}")
        return coll, key

    def _need(self, which: str) -> CollectionBackend:
        coll = getattr(self, which)
        if coll is None:
            how = "--images DIR or --features DIR" if which == "images" else "--captions FILE"
            raise ConfigError(f"{self.root} has no indexed {which}; build it with {how}")
        return coll

    # --- text -> image ---------------------------------------------------------------------
    @torch.no_grad()
    def encode_queries(self, texts: list[str]) -> tuple[TextEncoding, np.ndarray]:
        tokens, lengths = self.model.tokenize(texts)
        txt = self.model.encode_texts(tokens.to(self.device), lengths.to(self.device))
        q = self.stage1_source.text_vectors(texts, txt, self.n_regions)
        return txt, q.float().cpu().numpy()

    def search(self, text: str, k: int = 10, candidates: int | None = None, where=None) -> list[SearchHit]:
        """The ``k`` best images for ``text``: top ``candidates`` by stage 1, re-ranked by the model. ``where``: a
        filter applied in stage 1 (a :class:`vlmatch.search.filters.Where` or a dict of its fields)."""
        return self.search_many([text], k, candidates, where)[0]

    @torch.no_grad()
    def search_many(self, texts: list[str], k: int = 10, candidates: int | None = None, where=None
                    ) -> list[list[SearchHit]]:
        """:meth:`search` for several queries (text encoding and stage 1 batched)."""
        if not texts or not all(shows_text(t) for t in texts):
            raise ConfigError("a search query must be a non-empty text (not only spaces or invisible characters)")
        self._need("images")
        where = Where.of(where)  # a bad filter is refused before any model work
        t0 = time.perf_counter()
        txt, q = self.encode_queries(texts)
        t_text = time.perf_counter() - t0
        out = self.rank_images(txt, q, k, candidates, where, texts=texts)
        self.last_timings = {"text": t_text, **self.last_timings}
        return out

    @torch.no_grad()
    def rank_images(self, txt: TextEncoding, q: np.ndarray, k: int = 10, candidates: int | None = None,
                    where=None, texts: list[str] | None = None) -> list[list[SearchHit]]:
        """Two-stage ranking of encoded queries (``txt``: text encodings, ``q``: (n, d) stage-1 vectors); ``texts``:
        their words, for the AND re-scoring (:mod:`vlmatch.search.compose`); ``where`` as in :meth:`search`."""
        coll = self._need("images")
        n_hits, cand = _sizes(k, candidates, len(coll))
        where = Where.of(where)
        t1 = time.perf_counter()
        stage1_scores, rows = coll.search(q, cand) if where is None else coll.search(q, cand, where=where)
        t2 = time.perf_counter()
        out = []
        rel = self.relevance
        for i in range(len(q)):
            text = texts[i] if texts is not None else None
            hits = self._rerank_images(coll, txt.select(slice(i, i + 1)), rows[i], stage1_scores[i], n_hits, text)
            out.append(with_relevance(hits, rel))
        t3 = time.perf_counter()
        self.last_timings = {"stage1": t2 - t1, "stage2": t3 - t2, "queries": len(q)}
        return out

    def _rerank_images(self, coll: CollectionBackend, txt: TextEncoding, rows: np.ndarray, stage1_scores: np.ndarray, k: int,
                       text: str | None = None):
        ok = rows >= 0
        rows, stage1_scores = rows[ok], stage1_scores[ok]
        if self.stage1_is_score:
            order = self._and_order(coll, text, rows, stage1_scores)
            hits = _ranked(coll, rows, stage1_scores if order is None else order, stage1_scores, k, "path",
                           keep=self.photo_root.keep)
            for h in hits:  # ranked by the AND re-scoring or not, each hit shows its fused score
                h.score = h.stage1_score
            return hits
        rows, stage1_scores, scores = self._rescored(coll, rows, stage1_scores, lambda img: score_blocks(
            self.model, img, [(np.arange(1), txt)], 1, max(1, len(rows)), progress=False)[:, 0])
        return _ranked(coll, rows, scores, stage1_scores, k, "path", keep=self.photo_root.keep)

    def _rescored(self, coll: CollectionBackend, rows: np.ndarray, stage1_scores: np.ndarray, score_of):
        """(rows, stage-1 scores, stage-2 scores) of the candidates, in file order (the memory map read in that
        order); ``score_of(encodings)``: the model's score of each, fused as the index ranks (:meth:`_fused`)."""
        order = np.argsort(rows, kind="stable")
        rows, stage1_scores = rows[order], stage1_scores[order]
        return rows, stage1_scores, self._fused(score_of(coll.take(rows).to(self.device)), stage1_scores)

    def _and_order(self, coll: CollectionBackend, text: str | None, rows: np.ndarray, stage1_scores: np.ndarray):
        """The candidates' AND re-scoring (a query naming several things: :mod:`vlmatch.search.compose`), or None
        where it does not apply (no open-vocabulary part, its beta 0, a query of fewer than two content words)."""
        from .compose import query_terms, rescore

        open_vocab = self.stage1_source.open_vocab
        if open_vocab is None or not open_vocab.fusion.and_beta or text is None or len(rows) < 3:
            return None
        terms = query_terms(text)
        if len(terms) < 2:
            return None
        # each photo's concept vector: the last columns of its stored stage-1 vector (on every backend)
        concepts = coll.stage1_vectors(rows)[:, -open_vocab.dim:]
        words = open_vocab.text_vectors(terms).float().numpy()
        return rescore(stage1_scores, concepts @ words.T, open_vocab.fusion.and_beta)

    @property
    def relevance(self):
        """The relevance scale of this index's scores (:class:`vlmatch.search.open_vocab.Relevance`), or None:
        none recorded, or the score a hit shows is not the one it was fitted on (:attr:`relevance_note`)."""
        open_vocab = self.stage1_source.open_vocab
        return None if open_vocab is None or self.relevance_note is not None else open_vocab.relevance

    @property
    def relevance_note(self) -> str | None:
        """Why this index's results carry no relevance although its fusion records a scale (one line), else None.
        The scale was fitted on the fused stage-1 score of the model that ships it: a hit shows that score only when
        stage 1's scores are final (no re-scorer, no ``--score mean``)."""
        open_vocab = self.stage1_source.open_vocab
        if open_vocab is None or open_vocab.relevance is None or self.stage1_is_score:
            return None
        why = ("the score shown is the mean of the re-scorer's and stage 1's" if self.score_mode == "mean"
               else "the score shown is the re-scorer's" if self.retriever is not None
               else "the score shown is the model's own stage-2 score")
        return f"no relevance: {why}, not the fused stage-1 score its scale was fitted on"

    def _fused(self, scores: np.ndarray, stage1_scores: np.ndarray) -> np.ndarray:
        return (scores + stage1_scores) / 2 if self.score_mode == "mean" else scores

    # --- photo -> photos (search by photo: vlmatch.search.library.similar) ---------------------------
    def search_like(self, image_or_id, k: int = 10, text: str | None = None, where=None,
                    candidates: int | None = None, text_weight: float | None = None) -> list[SearchHit]:
        """The ``k`` indexed photos most like a photo (an indexed id, or a file path, bytes, PIL image or array),
        optionally also matching ``text`` ("like this one, but at night"): :mod:`vlmatch.search.library.similar`."""
        from .library.similar import DEFAULT_TEXT_WEIGHT, search_like

        return search_like(self, image_or_id, k, text=text, where=where, candidates=candidates,
                           text_weight=DEFAULT_TEXT_WEIGHT if text_weight is None else text_weight)

    # --- image -> text ---------------------------------------------------------------------
    @torch.no_grad()
    def encode_image(self, image) -> tuple[ImageEncoding, np.ndarray]:
        """An image -> (stage-2 encoding, stage-1 vector). ``image``: a file path, the file's bytes,
        a PIL image, an HxWx3 uint8 array, or already its features (k, img_dim) float array."""
        if isinstance(image, np.ndarray) and image.dtype.kind == "f" or torch.is_tensor(image):
            feats = torch.as_tensor(np.array(image, dtype=np.float32))
        else:
            feats = self.image_features(image)
        if feats.dim() == 2:
            feats = feats[None]
        feats = feats.to(self.device)
        img = self.model.encode_images(feats)
        return img, self.stage1_source.image_vectors(feats, img).float().cpu().numpy()

    @torch.no_grad()
    def search_image(self, image, k: int = 10, candidates: int | None = None) -> list[SearchHit]:
        """The ``k`` best indexed captions for an image (a file path or its features)."""
        coll = self._need("captions")
        n_hits, cand = _sizes(k, candidates, len(coll))
        t0 = time.perf_counter()
        img, q = self.encode_image(image)
        open_vocab = self.stage1_source.open_vocab
        if open_vocab is not None:  # the fusion weighs each query's concept part for text -> photo; across captions that
            q[:, -open_vocab.dim:] = 0  # weight would rank captions by their unseen words: photo -> caption reads the ranker's
        t1 = time.perf_counter()
        stage1_scores, rows = coll.search(q, cand)
        t2 = time.perf_counter()
        ok = rows[0] >= 0
        r, s = rows[0][ok], stage1_scores[0][ok]
        scores = s  # stage 1's scores are final (see _rerank_images), else the model's
        if not self.stage1_is_score:
            r, s, scores = self._rescored(coll, r, s, lambda txt: score_blocks(
                self.model, img, [(np.arange(len(r)), txt)], len(r), 1, progress=False)[0])
        res = _ranked(coll, r, scores, s, n_hits, "text")
        self.last_timings = {"image": t1 - t0, "stage1": t2 - t1, "stage2": time.perf_counter() - t2, "queries": 1}
        return res

    def image_features(self, image, backbone=None, mirror: bool = False) -> torch.Tensor:
        """Grid features (1, k, dim) of an image (path, bytes, PIL image or uint8 array) with the index's backbone (or
        ``backbone``); with ``mirror``, (2, k, dim): the image's and its mirror image's (one backbone pass)."""
        from ..features.backbones import backbone_for
        from ..features.views import mirror_pixels

        bb_info = self.manifest.get("backbone")
        if not bb_info:
            raise ConfigError(f"{self.root} was built from features without a known backbone; pass features, not an image")
        if backbone is None and self._backbone is None:
            self._backbone = backbone_for(bb_info)
        bb = backbone or self._backbone
        pixels = _pixels(image, bb.info.input_size)
        with torch.inference_mode():
            return bb(bb.preprocess([pixels, mirror_pixels(pixels)] if mirror else [pixels])).clone()

    # --- attention of one result -----------------------------------------------------------
    def explainer(self, method: str | None = None) -> tuple[MatchingModel, str]:
        """(model, method) whose maps explain a result: :meth:`_explainer`'s pick."""
        model, method, _ = self._explainer(method)
        return model, method

    def _explainer(self, method: str | None = None) -> tuple[MatchingModel, str, bool]:
        """(model, method, mirror) whose maps explain a result (``mirror``: its shipped record averages the maps with
        the mirror image's). No ``method``: of the index's models and the shipped default explainer, the one whose
        registry entry records the best pointing (an index built from features: its stored attention); a
        ``method``: the index's model with the better pointing that has it."""
        from ..evaluation.explainers import check_method, default_method, supports
        from ..pretrained import explainer_record

        models = [(key, m) for key, m in (("model", self.model), ("retriever", self.retriever)) if m is not None]
        records = {key: explainer_record(self.parts[key]) if key in self.parts else None for key, _ in models}
        ranked = sorted(models, key=lambda km: -(records[km[0]] or {}).get("pointing", -1.0))
        mirror = {key: bool((records[key] or {}).get("mirror")) for key, _ in models}
        if method is None and not self.manifest.get("backbone") and supports(self.model, "attention"):
            # built from features: only the stored encodings can be explained
            return self.model, "attention", mirror["model"]
        if method is None:
            key, m = ranked[0]
            shipped = self._shipped_explainer_if_better((records[key] or {}).get("pointing", -1.0))
            if shipped is not None:
                return shipped.model, shipped.method, shipped.mirror
            recorded = (records[key] or {}).get("method")
            return m, recorded if recorded and supports(m, recorded) else default_method(m), mirror[key]
        check_method(method)
        for key, m in ranked:
            if supports(m, method):
                return m, method, mirror[key]
        raise ConfigError(f"--method {method}: neither model of {self.root} has such maps")

    def _shipped_explainer_if_better(self, pointing: float) -> _ShippedExplainer | None:
        """The shipped default explainer (loaded once) when its registry entry records a better pointing figure than
        ``pointing`` and its backbone is installed (None when it is the index's); else None."""
        from ..features.backbones import backbone_for
        from ..models.registry import load_model
        from ..pretrained import default_explainer, get

        if self._shipped_explainer is None:
            self._shipped_explainer = False
            try:
                name, method = default_explainer()
                entry = get(name)
                if entry.explainer.get("pointing", -1.0) > pointing:
                    same = entry.features == self.manifest.get("backbone")
                    bb = None if same else backbone_for(entry.features)
                    model = load_model(f"pretrained:{name}", self.device).eval()
                    self._shipped_explainer = _ShippedExplainer(model, method, bb, name,
                                                                bool(entry.explainer.get("mirror")))
            except VlmatchError:  # none ships, or its backbone is an extra that is not installed
                pass
        return self._shipped_explainer or None

    def explain(self, item_id: int, text: str, method: str | None = None, phrases=(), mirror: bool | None = None):
        """Heat maps of image ``item_id`` and ``text`` (a :class:`vlmatch.viz.attention.PairAttention`) by ``method``,
        from the model :meth:`explainer` picks; all but the stage-2 model's ``attention`` (the stored encoding) read
        the photo file again. ``mirror``: average each map with the mirror image's (default: as the model's record)."""
        from ..viz.attention import attention_of_encodings, explain_pair

        coll, key = self._key(item_id)
        model, method, recorded_mirror = self._explainer(method)
        path = self.photo_root.current(coll.items_of([key])[0])  # the file as indexed, else one line saying not
        shipped = self._shipped_explainer if self._shipped_explainer and self._shipped_explainer.model is model else None
        own_backbone = shipped.backbone if shipped else None  # the shipped explainer's, when not the index's
        mirror = recorded_mirror if mirror is None else mirror
        if method == "attention" and model is self.model and not phrases and not mirror:
            with torch.no_grad():
                img = coll.take(np.array([key])).to(self.device)
                att = attention_of_encodings(self.model, img, text)
        else:
            views = self.image_features(path, own_backbone, mirror=mirror).cpu().numpy()
            att = explain_pair(model, views[0], text, method, tuple(phrases),
                               mirror_features=views[1] if mirror else None)
        bb = own_backbone.describe() if own_backbone is not None else self.manifest.get("backbone") or {}
        att.grid = bb.get("grid")
        if shipped:
            att.model = f"pretrained:{shipped.name}"
        else:
            key = "model" if model is self.model else "retriever"
            att.model = (self.manifest.get(key) or {}).get("checkpoint") or model.name
        att.image = path
        # the score search shows for this photo and text, split into the maps' part and the concept part
        att.parts = score_parts(self, item_id, text)
        att.shows = shows_line(att)
        return att

    def explain_png(self, item_id: int, text: str, method: str | None = None, shared_scale: bool = False) -> bytes:
        """:meth:`explain` drawn as a heat-map PNG on the indexed image file (one panel per content word, each on
        its own colour scale; ``shared_scale``: on one)."""
        from ..viz.heatmap import render

        att = self.explain(item_id, text, method)
        if not att.grid:
            raise ConfigError(f"{self.root}: no image grid is known (built from features without a backbone)")
        return render(att, att.image, shared_scale=shared_scale)


@dataclass
class _ShippedExplainer:
    """The shipped default explainer as an index loaded it (:meth:`Index._shipped_explainer_if_better`)."""

    model: MatchingModel
    method: str
    backbone: object | None  # a Backbone when it is not the index's own
    name: str  # its registry name
    mirror: bool = False  # its record explains with the photo's mirror view too


def _models(parts: dict, device, lean: bool) -> tuple[MatchingModel, MatchingModel | None]:
    """An index's model and retriever (``parts``: their folders), ready for queries."""
    from ..encoders.hf import for_queries

    model, retriever = index_models(parts, device)
    for_queries(model, retriever, lean=lean)
    return model, retriever


def _pixels(image, size: int) -> np.ndarray:
    """uint8 (size, size, 3) pixels of an image given as a path, the file's bytes, a PIL image or an array,
    as displayed (:mod:`vlmatch.features.photo`: EXIF orientation applied, colour normalised)."""
    from PIL import Image

    from ..features.photo import load_image, orientation_of, to_rgb, upright

    if isinstance(image, (str, Path, bytes, bytearray)):
        return load_image(image if isinstance(image, (bytes, bytearray)) else Path(image), size)
    try:
        if isinstance(image, np.ndarray):
            pil = Image.fromarray(np.asarray(image, dtype=np.uint8)).convert("RGB")
        else:
            pil = to_rgb(upright(image, orientation_of(image)))
    except (OSError, ValueError, AttributeError, TypeError) as e:
        raise DataError("image", f"not a readable image ({e})") from None
    return np.asarray(pil.resize((size, size), Image.BILINEAR), dtype=np.uint8)
