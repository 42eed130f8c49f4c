"""A study's declared hypotheses: the ``study:`` block of an experiment config.

Written before any run, carried in every job's config, read by ``python -m modforge.report``: the question,
the metric and its direction, the baseline, the comparisons that form the family, the equivalence margin, the
level and the collapse tolerance. Checked here, once, at the pre-flight of ``train`` (before any work) and
again by ``report``.
"""
import math
from typing import Any

from modforge.errors import ConfigError

STUDY_KEYS = {"question": "the question, in words", "metric": "a val metric, e.g. val/loss",
              "better": "min or max", "baseline": "the baseline's overrides, e.g. norm=layer",
              "compare": "the family: a list of configurations by their overrides, e.g. [norm=rms, norm=batch]",
              "margin": "the equivalence margin, a positive number in the metric's units",
              "level": "the family's confidence level in [0.5, 1)",
              "collapse_tol": "nats >= 0: a final val/loss this close to the unigram model's is a collapse"}


def check_study(block: Any) -> dict:
    """The block as a plain dict, or one line naming the key, its value and what is allowed."""
    if not isinstance(block, dict):
        raise ConfigError(f"study={block!r}: a mapping of {', '.join(STUDY_KEYS)}")
    out = dict(block)
    for key, value in out.items():
        if key not in STUDY_KEYS:
            raise ConfigError(f"study.{key}: not a key of a study block; keys: {', '.join(STUDY_KEYS)}")

        def bad() -> ConfigError:
            return ConfigError(f"study.{key}={value!r}: {STUDY_KEYS[key]}")

        if key in ("question", "metric") and not (isinstance(value, str) and value.strip()):
            raise bad()
        if key == "better" and value not in ("min", "max"):
            raise bad()
        if key == "baseline" and not _spec(value):
            raise bad()
        if key == "compare":
            value = [value] if isinstance(value, str) else value
            if not (isinstance(value, (list, tuple)) and value and all(_spec(v) for v in value)):
                raise bad()
            out[key] = [str(v) for v in value]
        if key in ("margin", "level", "collapse_tol"):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise bad()
            if (key == "margin" and value <= 0) or (key == "level" and not 0.5 <= value < 1) or \
                    (key == "collapse_tol" and value < 0):
                raise bad()
    return out


def _spec(v: Any) -> bool:
    """``key=value[,key2=value2]``: a configuration named by its overrides."""
    return isinstance(v, str) and all("=" in p and p.split("=", 1)[0] for p in v.split(","))
