"""Kept for one release: :mod:`vlmatch.config` is now :mod:`vlmatch.training.config` (import it from there).

This name is the very same module object, so every function and setting is shared."""

import sys

from .training import config as _moved

sys.modules[__name__] = _moved
