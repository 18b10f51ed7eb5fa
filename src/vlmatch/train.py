"""Kept for one release: :mod:`vlmatch.train` is now :mod:`vlmatch.training.loop` (import it from there).

This name is the very same module object, so every function and setting is shared."""

import sys

from .training import loop as _moved

sys.modules[__name__] = _moved
