"""Checkpoint folders: the one room that reads, writes, seals and digests them.

A checkpoint is one folder: ``model.safetensors`` (the weights), ``config.json`` (the registered model's name,
its options, the weights' SHA-256 and the folder's format), ``checksums.json`` (every file's SHA-256) and, as
the model has them, ``vocab.json``, the text encoder's record and tokenizer copy and the calibration; a training
checkpoint (``last/``) adds the optimiser and the trainer state. JSON and safetensors only, never pickle.

- :mod:`.read`: a folder resolved and read once, each file checked (hashes, then shapes) before a model is
  built from it; a trainer state read back for a resume.
- :mod:`.write`: a model saved into a folder, sealed last; a training checkpoint swapped in whole.
- :mod:`.seal`: ``checksums.json``, written last and checked first; a folder saved sealed without it is refused.
- :mod:`.digest`: one digest for a whole folder, as a search index records the checkpoints it uses.

The room sits under :mod:`vlmatch.models` (which saves and loads through it) and over the encoders and the data
(LoRA's pooler keys, the vocabulary); it never imports the models: what is model-specific (building a model, its
own files, its calibration) reaches it as a callable or a method of the model. Importing this package, or
:mod:`.read`, imports no torch (the command line resolves ``--model`` arguments with it).
"""
