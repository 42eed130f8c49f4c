"""Downstream evaluations: multiple-choice and text tasks in JSONL, scored by ranked log-likelihood and bits per
byte (:mod:`modforge.evals.tasks`, :mod:`modforge.evals.scoring`)."""
