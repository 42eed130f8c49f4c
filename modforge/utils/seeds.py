"""Common random numbers: one independent seed per purpose, derived from a run's ``seed``.

Two runs with the same ``seed`` that differ only in a component must see the same training batches, the same
masks and the same dropout stream, whatever the component's parameter shapes; otherwise a paired comparison
over seeds pairs runs that differ in more than the component. Drawing everything from one global generator
fails that: building the model consumes random numbers in an amount that depends on its shapes, and every
draw after it (the data order, masking, dropout) shifts. So each purpose has its own stream:

* ``init``: parameter initialisation (the global generator, seeded just before the model is built);
* ``data``: the order of training examples (each epoch's permutation, :mod:`modforge.data.loading`);
* ``task-data``: data-side randomness inside a task (masked-LM selection and replacements);
* ``dropout``: the global generator again, re-seeded once the model is built.

A derived seed is the first 63 bits of SHA-256 over ``modforge/<seed>/<purpose>``: independent of Python's
hash randomisation, of the platform and of every other purpose's seed.
"""
import hashlib

PURPOSES = ("init", "data", "task-data", "dropout")


def derive(seed: int, purpose: str) -> int:
    """The seed of ``purpose``'s stream for run seed ``seed`` (a non-negative 63-bit integer)."""
    digest = hashlib.sha256(f"modforge/{int(seed)}/{purpose}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1
