"""Kept for one release: :mod:`vlmatch.explain` is now :mod:`vlmatch.viz.attention` (import it from there)."""

import sys

from .viz import attention as _moved

sys.modules[__name__] = _moved
