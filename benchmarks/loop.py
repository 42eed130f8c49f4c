"""End to end against the bare step: what Lightning's loop and the data pipeline cost, in one process.

    python benchmarks/loop.py [--steps 200] [--rounds 5] [--threads N] [--profile] [overrides ...]

Both sides train the default run's model and data (``decoder_only``, d_model 128,
4 layers, 4 heads, block 64, batch 12, the stdlib character corpus) with the
default optimizer and schedule, gradient clipping at 1.0, or the run that the
overrides describe (e.g. ``experiment=shakespeare_char data.path=...``):

* **bare**: a hand-written loop as in nanoGPT: a whole batch of windows taken
  from the token array with one indexing operation, forward, loss, backward,
  clip, optimizer and schedule step;
* **loop**: modforge's own task and datamodule under ``lightning.Trainer.fit``
  with the default trainer settings, without validation and checkpoints (a
  run's validations are not in its tokens/s either); the time is what
  ``metrics.json``'s ``tokens_per_sec`` divides by
  (:class:`modforge.run.callbacks.CarriedState`: first to last training batch);
* **loop as a run**: the same with what a run adds around the loop: the CSV
  logger, the learning-rate monitor, the divergence check and the progress
  display a log file gets.

Rounds alternate (bare, loop, loop as a run) so drift on a noisy machine hits both; the
report is the median tokens/second of each and their ratio. ``--profile`` adds
one loop round under Lightning's simple profiler and prints where its time goes.
"""
import argparse
import statistics
import time

import torch
import torch.nn.functional as F


def setup(overrides: list[str]):
    from modforge import registry
    from modforge.config import compose
    from modforge.config.composition import to_plain

    cfg = compose([*overrides, "trainer.enable_progress_bar=false", "sample=false", "eval_at_start=false"])
    dm = registry.build("data", cfg.data)
    facts = dm.prepare()
    entry, task_cfg = registry.make_config("task", cfg.task)
    return cfg, dm, facts, lambda: entry.cls(task_cfg, to_plain(cfg), facts)


def bare_round(cfg, dm, task, steps: int) -> float:
    """Tokens/s of the hand-written loop."""
    from modforge import registry

    data = torch.from_numpy(dm.train_tokens[:].astype("int64"))  # the memory-mapped train split, in memory
    T, B = cfg.data.block_size, cfg.data.batch_size
    offsets = torch.arange(T + 1)
    model = task.model
    opt = registry.build("optim", cfg.optim, model.parameters())
    sched = registry.build("scheduler", cfg.scheduler, opt, d_model=cfg.model.d_model, total_steps=cfg.trainer.max_steps)
    model.train()
    t0 = time.perf_counter()
    for _ in range(steps):
        ix = torch.randint(len(data) - T - 1, (B, 1))
        xy = data[ix + offsets]
        x, y = xy[:, :-1], xy[:, 1:]
        logits = model(x)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), y.reshape(-1))
        loss.backward()
        if cfg.trainer.get("gradient_clip_val"):
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.trainer.gradient_clip_val)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
    return steps * B * T / (time.perf_counter() - t0)


def loop_round(cfg, dm, task, steps: int, profiler=None, as_run: bool = False) -> float:
    """Tokens/s as a real run reports them (tokens / CarriedState.train_seconds). ``as_run``: with what a run
    adds around the loop (CSV logger, learning-rate monitor, divergence check, log-progress lines)."""
    import tempfile

    import lightning as L
    from lightning.pytorch.callbacks import LearningRateMonitor
    from omegaconf import OmegaConf

    from modforge.run.callbacks import DivergenceStop, CarriedState
    from modforge.run.monitoring import AppendingCSVLogger, LogProgress
    from modforge.utils.console import quiet

    quiet()
    settings = OmegaConf.to_container(cfg.trainer, resolve=True)
    settings.update(max_steps=steps, limit_val_batches=0, enable_checkpointing=False, enable_model_summary=False,
                    profiler=profiler, enable_progress_bar=as_run)
    record = CarriedState()
    callbacks, logger = [record], False
    if as_run:
        callbacks += [DivergenceStop(3), LearningRateMonitor(logging_interval="step"), LogProgress(10 ** 9)]
        logger = AppendingCSVLogger(tempfile.mkdtemp(), name="logs", version="")
    trainer = L.Trainer(**settings, logger=logger, callbacks=callbacks)
    before = task.tokens_seen
    trainer.fit(task, datamodule=dm)
    return (task.tokens_seen - before) / record.train_seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("overrides", nargs="*", help="key=value overrides of the run measured (default: the default run)")
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    import logging
    import warnings

    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")
    cfg, dm, facts, new_task = setup(a.overrides)
    torch.manual_seed(0)
    bare_task, loop_task = new_task(), new_task()
    bare_round(cfg, dm, bare_task, 20)  # warm-up of both
    loop_round(cfg, dm, loop_task, 20)
    run_task = new_task()
    bare, loop, as_run = [], [], []
    for r in range(a.rounds):
        bare.append(bare_round(cfg, dm, bare_task, a.steps))
        loop.append(loop_round(cfg, dm, loop_task, a.steps))
        as_run.append(loop_round(cfg, dm, run_task, a.steps, as_run=True))
        print(f"round {r + 1}: bare {bare[-1]:,.0f}, loop {loop[-1]:,.0f}, loop as a run {as_run[-1]:,.0f} tokens/s")
    mb, ml, mr = statistics.median(bare), statistics.median(loop), statistics.median(as_run)
    print(f"median of {a.rounds} rounds of {a.steps} steps ({torch.get_num_threads()} threads, torch {torch.__version__}): "
          f"bare {mb:,.0f}, loop {ml:,.0f} ({ml / mb:.3f}x), loop as a run {mr:,.0f} ({mr / mb:.3f}x) tokens/s")
    if a.profile:
        from lightning.pytorch.profilers import SimpleProfiler

        prof = SimpleProfiler(extended=False)
        loop_round(cfg, dm, loop_task, a.steps, profiler=prof)
        print(prof.summary())


if __name__ == "__main__":
    main()
