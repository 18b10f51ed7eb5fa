"""Kept for one release: :mod:`vlmatch.train` is now :mod:`vlmatch.training.loop` (import it from there)."""

import sys

from .training import loop as _moved

sys.modules[__name__] = _moved
