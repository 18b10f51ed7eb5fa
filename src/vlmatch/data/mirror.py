"""The geometry of a mirror view (a photo with left and right swapped) on a grid of image positions, and the texts
it would contradict: the layer the feature files, the training batches and the explainers share."""

from __future__ import annotations

import re

import numpy as np

from ..errors import ConfigError

_SIDE = re.compile(r"\b(left|right)\b", re.IGNORECASE)


def names_a_side(text: str) -> bool:
    """Whether ``text`` names a side (left or right), which a mirror image turns around."""
    return bool(_SIDE.search(text))


def grid_of(k: int) -> int:
    """The side of a square grid of ``k`` positions; a one-line error when ``k`` is not a square."""
    g = int(round(k ** 0.5))
    if g * g != k:
        raise ConfigError(f"a mirror view needs grid features: {k} positions are not a square grid")
    return g


def mirror_grid(weights, grid: int):
    """Per-position values (k, ...) of a ``grid`` x ``grid`` map (row-major, k = grid²; a numpy array or a torch
    tensor) with each row's columns reversed: position (r, c) of a mirror image holds what position
    (r, grid - 1 - c) of the photo holds. Its own inverse."""
    k = weights.shape[0]
    if k != grid * grid:
        raise ConfigError(f"a mirror view needs grid maps: {k} positions are not a {grid} x {grid} grid")
    rest = tuple(weights.shape[1:])
    w = weights.reshape(grid, grid, *rest)
    if isinstance(w, np.ndarray):
        return w[:, ::-1].reshape(weights.shape)
    return w.flip(1).reshape(weights.shape)
