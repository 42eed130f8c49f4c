"""Hydra loads sweepers only from ``hydra_plugins``: this is modforge's (``hydra/sweeper=modforge``, the default of
``python -m modforge.train``, used where Hydra's own app runs the sweep: ``--config-path``); everything it does is
:class:`modforge.sweeps.sweeper.PlannedSweeper`'s. Importing it is
cheap (no torch, no Lightning), as every Hydra app in the environment imports it."""
from modforge.sweeps import sweeper as sweep


class ModforgeSweeper(sweep.PlannedSweeper):
    """Hydra's basic sweeper, planned from the job directories (see :mod:`modforge.sweeps.sweeper`)."""
