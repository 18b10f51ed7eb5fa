"""Kept for one release: :mod:`vlmatch.metrics` is now :mod:`vlmatch.evaluation.metrics` (import it from there).

This name is the very same module object, so every function and setting is shared."""

import sys

from .evaluation import metrics as _moved

sys.modules[__name__] = _moved
