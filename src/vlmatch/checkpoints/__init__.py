"""Checkpoint folders (weights, config.json, checksums.json and the model's own files; JSON and safetensors
only): :mod:`.read` loads and checks them, :mod:`.write` saves them, :mod:`.seal` writes and checks
checksums.json, :mod:`.digest` gives one digest for a folder. Below :mod:`vlmatch.models`, which it never
imports; importing it imports no torch.
"""
