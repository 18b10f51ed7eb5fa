"""Mirror views of a heat map: a photo's map averaged with its mirror image's map, mirrored back.

A convolutional network's features of a mirror image are not its features of the photo mirrored, so the
mirror's map is a second look whose errors are partly its own, and the mean of the two points better
(docs/grounding.md). With ``contribution`` the mean still sums to the mean of the two scores; the score that
ranks is the photo's alone. A text that names a side (``left``, ``right``) is explained on the photo alone.
"""

from __future__ import annotations

import numpy as np

from ..data.mirror import grid_of, mirror_grid, names_a_side
from ..errors import ConfigError

__all__ = ["grid_of", "merge_views", "mirror_grid", "names_a_side"]


def merge_views(photo: np.ndarray, mirror: np.ndarray | None, grid: int) -> np.ndarray:
    """The mean of a photo's map and its mirror image's map mirrored back (the photo's alone without one)."""
    if mirror is None:
        return np.asarray(photo)
    if np.shape(mirror) != np.shape(photo):
        raise ConfigError(f"the mirror view's maps {np.shape(mirror)} do not match the photo's {np.shape(photo)}")
    return (np.asarray(photo) + mirror_grid(np.asarray(mirror), grid)) / 2
