"""The service's request and response models: they validate the bodies and document the OpenAPI schema
(``/openapi.json``)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

NO_MATCH = "no photo matches these filters"
Method = Literal["attention", "contribution", "gradient", "occlusion"]  # vlmatch.evaluation.explainers.METHODS
METHOD_HELP = ("how the maps are made: attention (the model's own weights), contribution (each position's exact "
               "share of the score), gradient (gradient x input), occlusion (score drop with the position masked); "
               "default: the model's best-grounding method")

FILTER_HELP = {  # the filters of a photo search (vlmatch.search.filters), applied in stage 1
    "after": "only photos taken on or after this date (YYYY-MM-DD or ISO 8601 time); undated photos are left out",
    "before": "only photos taken on or before this date (YYYY-MM-DD: the whole day)",
    "camera": "only photos whose camera make and model contain this text (any case)",
    "under": "only photos in this subfolder of the indexed photo folder (any depth)",
    "near": "only photos whose GPS position is within KM kilometres of LAT,LON: 'LAT,LON,KM'",
}


class SearchRequest(BaseModel):
    # JSON types as sent: ``k: true`` or ``like: true`` is refused (422 naming the field), not read as 1
    model_config = ConfigDict(strict=True)

    text: str | None = Field(None, description="the query sentence (required unless like is given)",
                             examples=["a dog runs on the beach"])
    like: int | None = Field(None, description="search by photo: the indexed image id whose look-alikes to return; "
                                               "with a text too, look-alikes that also match the text")
    text_weight: float | None = Field(None, description="with like and a text: the text's share (0..1) of the "
                                                        "combined score (default 0.5; see docs/search.md)")
    k: int = Field(10, description="results to return (1 .. max_k)")
    candidates: int | None = Field(None, description="stage-1 candidates re-scored by the model (k .. max_candidates; "
                                                     "default 100, or k if larger, within the cap)")
    min_score: float | None = Field(None, description="drop results whose (stage-2) score is below this")
    after: str | None = Field(None, description=FILTER_HELP["after"], examples=["2023-06-01"])
    before: str | None = Field(None, description=FILTER_HELP["before"], examples=["2023-08-31"])
    camera: str | None = Field(None, description=FILTER_HELP["camera"])
    under: str | None = Field(None, description=FILTER_HELP["under"])
    near: str | list[float] | None = Field(None, description=FILTER_HELP["near"] + " (or [LAT, LON, KM])",
                                           examples=["48.8566,2.3522,25"])


class SearchResult(BaseModel):
    id: int
    path: str = Field(..., description="the file's path inside the photo folder the index was built from")
    score: float = Field(..., description="the model's own (stage-2) score; results are ranked by it")
    stage1_score: float | None = Field(None, description="the stage-1 (global vector) score that chose the candidate")
    taken: str | None = Field(None, description="capture time, ISO 8601 (EXIF; absent when the photo records none)")
    camera: str | None = Field(None, description="camera make and model (EXIF)")
    gps: list[float] | None = Field(None, description="[latitude, longitude] in decimal degrees (EXIF GPS)")
    size: list[int] | None = Field(None, description="[width, height] in pixels, as the photo is displayed")
    relevance: float | None = Field(None, description="the probability that the photo matches the text, 0 to 1 "
                                    "(fitted on Flickr8k val; absent for an index without a relevance scale)")
    no_match: bool | None = Field(None, description="true when the relevance is under the index's 'nothing "
                                  "matches' threshold")


class SearchResponse(BaseModel):
    text: str | None
    like: int | None = Field(None, description="the indexed image id searched by (a search by photo)")
    k: int
    candidates: int
    results: list[SearchResult]
    no_match: str | None = Field(None, description="one line when even the best photo is unlikely to match: "
                                 "'no photo matches this well (best relevance R); closest: PATH'")
    relevance_note: str | None = Field(None, description="one line when the index records a relevance scale but the "
                                       "score shown is not the one it was fitted on (a re-scorer's, or score 'mean'): "
                                       "why the results carry no relevance")
    timings: dict[str, float] = Field(..., description="milliseconds: queue (waiting for a worker), search, total")
    message: str | None = Field(None, description=f"'{NO_MATCH}' when filters leave no photo (results empty)")


class CaptionResult(BaseModel):
    id: int
    text: str
    score: float


class ImageSearchResponse(BaseModel):
    k: int
    results: list[CaptionResult]
    timings: dict[str, float]


class ExplainParts(BaseModel):
    ranker: float = Field(..., description="the ranking model's part of the score (what the maps split)")
    concepts: float | None = Field(None, description="the zero-shot concept part of an open-vocabulary index's fused "
                                                     "score: a number, not drawn (not linear over the cells)")


class ExplainResponse(BaseModel):
    id: int
    text: str
    method: str = Field("attention", description="the explanation method that made the maps: attention, "
                                                 "contribution, gradient or occlusion")
    model: str | None = Field(None, description="the checkpoint whose maps these are: one of the index's two models, "
                                               "or the shipped default explainer when it points better")
    score: float | None = Field(None, description="the score a search shows for this photo and text")
    maps_score: float | None = Field(None, description="the explaining model's own score, which the maps split (the "
                                                       "ranking model's part of score where they agree)")
    parts: ExplainParts | None = Field(None, description="score split: ranker + concepts = score")
    mirrored: bool = Field(False, description="each map is the mean of the photo's and its mirror image's, mirrored "
                                              "back (the explainer's shipped record says so; a text naming left or "
                                              "right keeps the photo's alone); score stays the photo's")
    shows: str | None = Field(None, description="one line: what the maps split against the score shown (the ranking "
                                               "model's part; the concept part as a number)")
    words: list[str]
    weights: list[list[float]] = Field(..., description="one list per word: its weight on each image position")
    axis: str = Field(..., description='attention: "regions" (each word\'s weights sum to 1), "words" (each '
                                       'region\'s do) or "pair"; contribution: "score" (all weights sum to the score); '
                                       'gradient: "gradient"; occlusion: "drop"')
    grid: list[int] | None = Field(None, description="[rows, cols] when positions are a grid (row-major)")
    boxes: list[list[float]] | None = Field(None, description="[x0, y0, x1, y1] per position, as fractions of the image")
    vmax: float = Field(..., description="the largest weight of the words shown (the page draws each word on its own "
                                         "scale, its share of the word's part per cell, or on this one)")
    content: list[bool] = Field(default_factory=list, description="per word: a content word (the page opens on the "
                                                                  "first; special tokens and function words are not)")


class Health(BaseModel):
    status: str
    model: str
    index_size: int
    captions: int
    index_version: str | None = Field(None, description="the committed version of the index served (the start of "
                                                        "its manifest's seal): it changes with every build and update")
    version: str
    workers: int
    queue: int
    in_flight: int


class ErrorBody(BaseModel):
    error: str
    detail: str


ERRORS = {s: {"model": ErrorBody} for s in (400, 404, 413, 415, 422, 503)}
