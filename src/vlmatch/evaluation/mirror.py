"""Mirror views of a heat map: a photo's map averaged with its mirror image's map, mirrored back.

One pass of a stride-32 backbone gives a map that is noisy at the scale of a cell. A convolutional network's
features of a mirror image are not its features of the photo mirrored (its filters are not symmetric, and
EfficientNet's "same" padding is one-sided), so the mirror's map, mirrored back, is a second look whose errors
are partly its own: the mean of the two points better. Measured on Flickr8k val with the shipped default:
its own maps point 71.7 % alone and 76.8 % averaged with its mirror's (``docs/grounding.md``).

What it is: the mean of two exact explanations, the photo's score's and its mirror's (with ``contribution``,
each sums to its score, the mean to the mean of the two). The score that ranks is the photo's alone.

A text that names a side (``left``, ``right``) is explained on the photo alone: in the mirror its side is the
other one.
"""

from __future__ import annotations

import re

import numpy as np

from ..errors import ConfigError

_SIDE = re.compile(r"\b(left|right)\b", re.IGNORECASE)


def names_a_side(text: str) -> bool:
    """Whether ``text`` names a side (left or right), which a mirror image turns around."""
    return bool(_SIDE.search(text))


def mirror_grid(weights: np.ndarray, grid: int) -> np.ndarray:
    """Per-position weights (k, ...) of a ``grid`` x ``grid`` map (row-major, k = grid²) with each row's columns
    reversed: position (r, c) of a mirror image holds what position (r, grid - 1 - c) of the photo holds. Its
    own inverse."""
    w = np.asarray(weights)
    if w.shape[0] != grid * grid:
        raise ConfigError(f"a mirror view needs grid maps: {w.shape[0]} positions are not a {grid} x {grid} grid")
    return w.reshape(grid, grid, *w.shape[1:])[:, ::-1].reshape(w.shape)


def merge_views(photo: np.ndarray, mirror: np.ndarray | None, grid: int) -> np.ndarray:
    """The mean of a photo's map and its mirror image's map mirrored back (the photo's alone without one)."""
    if mirror is None:
        return np.asarray(photo)
    if np.shape(mirror) != np.shape(photo):
        raise ConfigError(f"the mirror view's maps {np.shape(mirror)} do not match the photo's {np.shape(photo)}")
    return (np.asarray(photo) + mirror_grid(mirror, grid)) / 2


def grid_of(k: int) -> int:
    """The side of a square grid of ``k`` positions; a one-line error when ``k`` is not a square."""
    g = int(round(k ** 0.5))
    if g * g != k:
        raise ConfigError(f"a mirror view needs grid features: {k} positions are not a square grid")
    return g
