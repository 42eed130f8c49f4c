"""The callbacks every run has, for its integrity: what it carries across a resume, when it stops, how its
checkpoints are written (what a run shows and logs is :mod:`modforge.run.monitoring`'s).

* :class:`CarriedState`: timers, global RNG states and the step-0 loss, carried in every checkpoint so that a
  resumed run continues bit for bit and reports times for the whole run;
* :class:`DivergenceStop`: stops a run whose training loss stays non-finite, remembering the last finite values;
* :class:`Checkpoints`: Lightning's ``ModelCheckpoint``, silent once a run has diverged;
* :class:`AtomicCheckpointIO`: checkpoints written whole or not at all;
* :func:`injected_fault`: test hooks that kill or fail a run at a chosen step or checkpoint write.
"""
import math
import os
import signal
import time
from pathlib import Path
from typing import Any, Optional

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.plugins.io import TorchCheckpointIO

from modforge.utils.files import atomic_file, remove_stale_temporaries
from modforge.utils.seeds import rng_states, set_rng_states


class CarriedState(L.Callback):
    """What a run carries across a resume besides weights, optimizer, schedule and loops (Lightning's part).

    * time: ``train_seconds`` (first to last training batch, validation excluded: the denominator of
      tokens/s), ``fit_seconds`` (inside ``Trainer.fit``) and ``wall_seconds`` (the whole command), summed
      over the sessions that produced the final state: work a killed session did after its last
      checkpoint is redone and counted once;
    * the global RNG states (torch, CUDA, numpy, Python) at the checkpoint, set again just before the
      resumed run's first training step, so dropout and masking draw what they would have drawn;
    * the validation loss at step 0 and the steps the run was resumed at;
    * ``warm``: the step and ``train_seconds`` after this session's first ``WARM_STEPS`` steps, from which
      the steady tokens/s is measured (a study's 30-step probe would otherwise count the first steps' start-up
      as if every step paid it).
    """

    WARM_STEPS = 5  # the first steps of a session (allocation, first backward) are left out of the steady rate

    @property
    def state_key(self) -> str:
        return "RunRecord"  # its key in checkpoints (its name before: checkpoints written then resume alike)

    def __init__(self, started: Optional[float] = None):
        self.started = time.perf_counter() if started is None else started  # this session's start
        self.train_before = self.fit_before = self.wall_before = 0.0
        self.val_loss_at_start: Optional[float] = None
        self.resumed_at: list[int] = []
        self._train_t0: Optional[float] = None
        self._val_t0: Optional[float] = None
        self._fit_t0: Optional[float] = None
        self._val_seconds = 0.0  # validation inside this session's training span
        self._rng: Optional[dict] = None
        self._resumed_step: Optional[int] = None
        self.first_step_clock: Optional[float] = None  # perf_counter at this session's first training batch
        self._session_batches = 0
        self.warm: Optional[tuple] = None  # (global step, train_seconds) once this session's first WARM_STEPS are done

    # ----------------------------------------------------------------- clocks
    def fit_started(self) -> None:
        self._fit_t0 = time.perf_counter()

    @property
    def train_seconds(self) -> float:
        if self._train_t0 is None:
            return self.train_before
        now = time.perf_counter()
        val = self._val_seconds + (now - self._val_t0 if self._val_t0 is not None else 0.0)
        return self.train_before + (now - self._train_t0) - val

    @property
    def fit_seconds(self) -> float:
        return self.fit_before + (time.perf_counter() - self._fit_t0 if self._fit_t0 is not None else 0.0)

    @property
    def wall_seconds(self) -> float:
        return self.wall_before + time.perf_counter() - self.started

    def on_train_start(self, trainer, pl_module):
        if self._rng is not None:  # nothing between here and the first step draws from them
            set_rng_states(self._rng)
            self._rng = None
        if self._resumed_step is not None:
            self.resumed_at.append(self._resumed_step)
            self._resumed_step = None
        self._train_t0, self._val_seconds = time.perf_counter(), 0.0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if self.first_step_clock is None:
            self.first_step_clock = time.perf_counter()
        if self._session_batches == self.WARM_STEPS * trainer.accumulate_grad_batches:
            self.warm = (trainer.global_step, self.train_seconds)
        self._session_batches += 1

    def on_validation_start(self, trainer, pl_module):
        if self._train_t0 is not None:
            self._val_t0 = time.perf_counter()

    def on_validation_end(self, trainer, pl_module):
        if self._val_t0 is not None:
            self._val_seconds += time.perf_counter() - self._val_t0
            self._val_t0 = None

    def on_train_end(self, trainer, pl_module):
        self.train_before, self._train_t0 = self.train_seconds, None

    # ----------------------------------------------------------------- checkpoint
    def state_dict(self) -> dict:
        return {"train_seconds": self.train_seconds, "fit_seconds": self.fit_seconds,
                "wall_seconds": self.wall_seconds, "val_loss_at_start": self.val_loss_at_start,
                "resumed_at": list(self.resumed_at)}

    def load_state_dict(self, state: dict) -> None:
        self.train_before = float(state.get("train_seconds", 0.0))
        self.fit_before = float(state.get("fit_seconds", 0.0))
        self.wall_before = float(state.get("wall_seconds", 0.0))
        self.val_loss_at_start = state.get("val_loss_at_start")
        self.resumed_at = list(state.get("resumed_at", []))

    def on_save_checkpoint(self, trainer, pl_module, checkpoint):
        checkpoint["rng_states"] = rng_states()
        for logger in trainer.loggers:  # what was logged up to here is on disk with the checkpoint, not in a buffer
            logger.save()

    def on_load_checkpoint(self, trainer, pl_module, checkpoint):
        self._rng = checkpoint.get("rng_states")
        self._resumed_step = int(checkpoint.get("global_step", 0))


# --------------------------------------------------------------------------- divergence

class DivergenceStop(L.Callback):
    """Stop a run whose training loss is non-finite (NaN or inf) ``patience`` training batches in a row (steps,
    unless gradients are accumulated).

    Remembers the last finite training loss and the last validation whose metrics were all finite, and
    the step the run diverged at; :class:`Checkpoints` writes nothing after it, so ``last.ckpt`` stays
    the last finite state. ``patience=None`` never stops (non-finite losses are then only recorded).
    """

    def __init__(self, patience: Optional[int]):
        self.patience = patience
        self.bad_steps = 0
        self.diverged_at: Optional[int] = None
        self.last_train: Optional[dict] = None  # {"step", "train/loss"}
        self.last_val: Optional[dict] = None  # {"step", "val/...": ...}
        self.val_weights: Optional[tuple] = None  # weights_fingerprint() at the last validation (this session)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if loss is None:
            return
        value = float(loss.detach())
        if trainer.world_size > 1:  # every rank decides the same, or one would stop while the others wait for it
            value = value if not trainer.strategy.reduce_boolean_decision(not math.isfinite(value), all=False) \
                else math.nan
        if math.isfinite(value):
            self.bad_steps = 0
            self.last_train = {"step": trainer.global_step, "train/loss": value}
            return
        self.bad_steps += 1
        if self.patience is not None and self.bad_steps >= self.patience and self.diverged_at is None:
            self.diverged_at = trainer.global_step
            trainer.should_stop = True

    def on_validation_end(self, trainer, pl_module):
        if trainer.sanity_checking or self.diverged_at is not None:
            return
        val = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("val/")}
        if val and all(math.isfinite(v) for v in val.values()):
            self.last_val = {"step": trainer.global_step, **val}
            self.val_weights = weights_fingerprint(pl_module)

    def state_dict(self) -> dict:
        return {"bad_steps": self.bad_steps, "last_train": self.last_train, "last_val": self.last_val}

    def load_state_dict(self, state: dict) -> None:
        self.bad_steps = int(state.get("bad_steps", 0))
        self.last_train, self.last_val = state.get("last_train"), state.get("last_val")


def weights_fingerprint(module) -> tuple:
    """Storage and in-place version of every parameter: equal fingerprints mean nothing has changed the weights
    (an optimizer step, a copy into them, a pruning or a replaced parameter all change it)."""
    return tuple((p.data_ptr(), p._version) for p in module.parameters())


class Checkpoints(ModelCheckpoint):
    """Lightning's ``ModelCheckpoint``, writing nothing once ``divergence`` has stopped the run, and keeping
    ``last.ckpt`` at the latest step: after every validation (Lightning skips it when ``val/loss`` did not
    improve) and when training ends at a step no validation checkpointed (``max_steps`` not a multiple of
    ``val_check_interval``: Lightning writes it at the end only if it never wrote one, so the last steps' weights
    were lost, and ``generate`` or ``eval`` of the run read older weights than its metrics.json)."""

    def __init__(self, divergence: DivergenceStop, **kwargs: Any):
        super().__init__(**kwargs)
        self.divergence = divergence

    def on_validation_end(self, trainer: "L.Trainer", pl_module: "L.LightningModule") -> None:
        """Lightning (2.6) rewrites ``last.ckpt`` at a validation only when it also saved the top-k one, i.e. when
        ``val/loss`` improved: after a validation that did not improve, a killed run resumed from the last one that
        did, and trained the steps between again. Here ``last.ckpt`` follows every validation."""
        super().on_validation_end(trainer, pl_module)
        if (self.save_last and not self._should_skip_saving_checkpoint(trainer)
                and self._last_global_step_saved < trainer.global_step):
            self._save_last_checkpoint(trainer, self._monitor_candidates(trainer))

    def on_train_end(self, trainer: "L.Trainer", pl_module: "L.LightningModule") -> None:
        if self.save_last and self._last_checkpoint_saved and self._last_global_step_saved < trainer.global_step:
            self._save_last_checkpoint(trainer, self._monitor_candidates(trainer))
            return
        super().on_train_end(trainer, pl_module)

    def _save_checkpoint(self, trainer: "L.Trainer", filepath: str) -> None:  # every save (top-k, last, end, ...)
        if self.divergence.diverged_at is None and self.divergence.bad_steps == 0:  # never non-finite weights
            super()._save_checkpoint(trainer, filepath)


class PauseAt(L.Callback):
    """``pause_at=k``: the run stops after step k as if interrupted there. Lightning validates at a requested stop,
    and the checkpoint callback then writes ``last.ckpt`` at step k (a validation step: the checkpoint a run that
    never paused writes there too), so running again without ``pause_at`` continues exactly."""

    def __init__(self, step: int):
        self.step = int(step)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step == self.step:
            trainer.should_stop = True


class SaveOnPreemption(L.Callback):
    """A job that a cluster preempts (or that is about to hit its time limit) writes ``last.ckpt`` at the end of
    the step in progress, then lets submitit requeue it: the requeued job resumes from that very step instead of
    the last periodic checkpoint. submitit's signal (``$SUBMITIT_PREEMPT_SIGNAL``, SIGUSR2 by default) is
    noted when it arrives and acted on between steps: a checkpoint written inside the signal handler could
    catch the weights half-updated. Under DDP the ranks agree at each step whether any was signalled (one
    small all-reduce), so they all reach the checkpoint's barrier together."""

    def __init__(self, signum: int, last: Path, divergence: DivergenceStop):
        self.signum, self.last, self.divergence = signum, Path(last), divergence
        self.pending: Optional[tuple] = None
        self.previous: Any = None
        self.step = 0

    @staticmethod
    def signal_of_submitit() -> Optional[int]:
        """The preemption signal when this process is a submitit job (SLURM, or its local executor), else None."""
        if not os.environ.get("SUBMITIT_EXECUTOR"):
            return None
        return getattr(signal, "SIG" + os.environ.get("SUBMITIT_PREEMPT_SIGNAL", "USR2"), None)

    def on_train_start(self, trainer, pl_module):
        self.previous = signal.getsignal(self.signum)
        self.step = trainer.global_step
        signal.signal(self.signum, self._note)

    def _note(self, signum, frame):
        self.pending = (signum, frame)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step == self.step:  # a micro-batch of gradient accumulation: not a whole step yet
            return
        self.step = trainer.global_step  # the same on every rank: they step together
        hit = self.pending is not None
        if trainer.world_size > 1:
            hit = trainer.strategy.reduce_boolean_decision(hit, all=False)
        if not hit:
            return
        if self.divergence.diverged_at is None and self.divergence.bad_steps == 0:  # never non-finite weights
            trainer.save_checkpoint(self.last)
        self._hand_back()

    def on_train_end(self, trainer, pl_module):
        self._hand_back()  # a signal noted after the last step: submitit still requeues (the run then completes)

    def on_exception(self, trainer, pl_module, exception):
        self._hand_back()

    def _hand_back(self) -> None:
        """Give the signal back to its previous handler, and pass it a signal noted and not yet acted on."""
        if self.previous is None:
            return
        previous, self.previous = self.previous, None
        signal.signal(self.signum, previous)
        noted, self.pending = self.pending, None
        if noted is not None and callable(previous):
            previous(*noted)  # submitit: requeue this job and exit (rank 0), or nothing (other ranks)


# --------------------------------------------------------------------------- writing checkpoints

class AtomicCheckpointIO(TorchCheckpointIO):
    """Checkpoints on local disk written to a temporary file beside the target, fsynced, then renamed.

    Lightning's own save serialises to memory and then writes the target in a
    fsspec transaction whose temporary file lives in the system temp directory;
    when that is another filesystem the final "rename" is a copy, and a crash
    during it leaves a truncated ``last.ckpt``. Here a crash at any point leaves
    the previous checkpoint intact; the temporary file of a killed process is
    removed at the next save. Remote URLs (``s3://`` ...) keep Lightning's path.
    """

    saves = 0  # checkpoint files this run has written (what a "kill@save=N" fault counts)

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Optional[Any] = None) -> None:
        if storage_options is not None or "://" in str(path):
            return super().save_checkpoint(checkpoint, path, storage_options)
        remove_stale_temporaries(Path(path))
        self.saves += 1
        try:
            with atomic_file(Path(path), "wb", durable=True) as fh:
                torch.save(checkpoint, fh)
                if injected_fault("kill", "save", self.saves):  # mid-write: the file is not renamed yet
                    fh.flush()
                    os.kill(os.getpid(), signal.SIGKILL)
        except RuntimeError as e:  # torch's writer: "[enforce fail at inline_container.cc:...] unexpected pos"
            raise write_failure(Path(path), e) from None


def write_failure(path: Path, e: BaseException) -> OSError:
    """A checkpoint that could not be written, as the OSError it is (one line naming the file): no space left on
    its disk when that is so (torch's writer reports a full disk as an internal assertion), else the writer's
    own first line. The previous checkpoint is intact (the write goes to a temporary file)."""
    import errno
    import shutil

    try:
        free = shutil.disk_usage(path.parent).free
    except OSError:
        free = None
    if free is not None and free < 64 * 2 ** 20:
        return OSError(errno.ENOSPC, f"no space left on the device writing this checkpoint ({free / 2 ** 20:.1f} "
                                     "MiB free; the previous checkpoint is kept: free some space and resume)", str(path))
    first = (str(e).strip().splitlines() or [type(e).__name__])[0]
    return OSError(errno.EIO, f"the checkpoint could not be written ({first[:160]})", str(path))


# --------------------------------------------------------------------------- injected faults (tests)

FAULT_ENV = "MODFORGE_FAULT"


def injected_fault(action: str, where: str, n: int) -> bool:
    """Whether ``$MODFORGE_FAULT`` asks for ``action`` ("kill", "raise") at ``where`` ("step", "save") number n.

    The variable holds comma-separated faults ``ACTION@WHERE=N`` (ACTION: kill, raise, preempt, hold) with an optional ``@job=J`` (only in job
    #J of a sweep), e.g. ``kill@step=7@job=1``: how the tests kill a run at a chosen step, or while it
    writes a checkpoint, or make one job of a sweep fail. Unset, nothing happens.
    """
    spec = os.environ.get(FAULT_ENV)
    if not spec:
        return False
    for fault in spec.split(","):
        parts = fault.strip().split("@")
        fields = dict(p.split("=", 1) for p in parts[1:] if "=" in p)
        if parts[0] != action or fields.get(where) != str(n):
            continue
        if "job" in fields and fields["job"] != str(_job_num()):
            continue
        return True
    return False


JOB_NUM_ENV = "MODFORGE_JOB_NUM"  # a sweep job's number where it runs as a single run (the gpus launcher's jobs)


def _job_num() -> Optional[int]:
    """This job's number in its sweep: the launcher's word where the job is its own single run (the gpus
    launcher), else Hydra's."""
    if os.environ.get(JOB_NUM_ENV, "").isdigit():
        return int(os.environ[JOB_NUM_ENV])
    from hydra.core.hydra_config import HydraConfig

    return HydraConfig.get().job.get("num") if HydraConfig.initialized() else None


HOLD_SECONDS = 300  # hold@step=N: how long the run waits there at most (until signalled)


class FaultInjector(L.Callback):
    """Acts on ``$MODFORGE_FAULT``'s ``kill@step=N`` (SIGKILL, as the OOM killer would), ``raise@step=N``
    (an exception), ``hold@step=N`` (waits there until the process is signalled: a test that stops a run is
    then sure it is still running) and ``preempt@step=N`` (SIGUSR2, once per run directory: a cluster's preemption, which
    submitit answers by requeueing the job) after training step N. Added to the Trainer only when the
    variable is set."""

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        step = trainer.global_step
        if injected_fault("kill", "step", step):
            os.kill(os.getpid(), signal.SIGKILL)
        if injected_fault("raise", "step", step):
            raise RuntimeError(f"fault injected at step {step} ({FAULT_ENV})")
        if injected_fault("hold", "step", step):  # a run that is still training when it is signalled, for sure
            deadline = time.monotonic() + HOLD_SECONDS
            while time.monotonic() < deadline and not getattr(trainer, "received_sigterm", False):
                time.sleep(0.05)
        once = Path(trainer.default_root_dir) / f".preempted-at-{step}"
        if injected_fault("preempt", "step", step) and trainer.is_global_zero and not once.exists():
            once.touch()  # once: the requeued run passes this step again; rank 0 only: the others must be told
            os.kill(os.getpid(), signal.SIGUSR2)  # what SLURM (and submitit's local executor) send to preempt a job
