"""Kept for one release: :mod:`vlmatch.metrics` is now :mod:`vlmatch.evaluation.metrics` (import it from there)."""

import sys

from .evaluation import metrics as _moved

sys.modules[__name__] = _moved
