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

A run's global random states, which its checkpoints carry so that a resumed run draws what it would have
drawn, are taken, set and checked here too (:func:`rng_states`, :func:`set_rng_states`, :func:`restore_fault`).
"""
import hashlib
from typing import Optional

PURPOSES = ("init", "data", "task-data", "dropout")


def derive(seed: int, purpose: str) -> int:
    """The seed of ``purpose``'s stream for run seed ``seed`` (a non-negative 63-bit integer)."""
    digest = hashlib.sha256(f"modforge/{int(seed)}/{purpose}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


# --------------------------------------------------------------------------- the global random states of a run

def rng_states() -> dict:
    """Every global random state a training step may draw from, as types a ``weights_only`` load accepts."""
    import random

    import numpy as np
    import torch

    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    states = {"torch": torch.get_rng_state(), "python": random.getstate(),
              "numpy": [kind, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(gauss)]}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def set_rng_states(states: dict, generators: Optional[tuple] = None) -> None:
    """Set the global random states :func:`rng_states` took. ``generators`` (torch's, Python's, numpy's): set
    those instead, the process's own untouched, CUDA's left out (a dry run: :func:`restore_fault`)."""
    import random

    import numpy as np
    import torch

    torch_rng, python_rng, numpy_rng = generators or (torch.default_generator, random, np.random)
    torch_rng.set_state(states["torch"])
    version, internal, gauss = states["python"]
    python_rng.setstate((version, tuple(internal), gauss))
    kind, keys, pos, has_gauss, cached = states["numpy"]
    numpy_rng.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    if "cuda" in states and torch.cuda.is_available() and generators is None:
        torch.cuda.set_rng_state_all(states["cuda"])


def restore_fault(ckpt: dict) -> Optional[str]:
    """Why the random states a checkpoint carries for a resumed run (the global ones, ``rng_states``; the task's
    data stream, ``task_data_rng``) cannot be set again, or None: each is set on generators of its own."""
    import random

    import numpy as np
    import torch

    tries = [("rng_states", lambda s: set_rng_states(s, (torch.Generator(), random.Random(), np.random.RandomState())))
             ] if ckpt.get("rng_states") is not None else []  # none recorded: the resumed run draws afresh
    if "task_data_rng" in ckpt:
        tries.append(("task_data_rng", lambda s: torch.Generator().set_state(s)))
    for field, restore in tries:
        try:
            restore(ckpt[field])
        except Exception as e:  # noqa: BLE001 - a state of another type, length or shape: whatever setting it raises
            first = (str(e).strip().splitlines() or [""])[0]
            return f"its {field} cannot be restored: {type(e).__name__}: {first[:120]}"
    return None
