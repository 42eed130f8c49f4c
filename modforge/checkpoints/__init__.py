"""Checkpoints: find, read and load them (:mod:`~modforge.checkpoints.files`), convert pretrained Hugging Face
models in (:mod:`~modforge.checkpoints.convert`) and export models out (:mod:`~modforge.checkpoints.export`),
one mapping per pretrained family (:mod:`~modforge.checkpoints.families`)."""
from modforge.checkpoints.files import find_checkpoint, load_checkpoint, read_checkpoint  # noqa: F401 - public
