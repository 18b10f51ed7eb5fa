"""Kept for one release: :mod:`vlmatch.config` is now :mod:`vlmatch.training.config` (import it from there)."""

import sys

from .training import config as _moved

sys.modules[__name__] = _moved
