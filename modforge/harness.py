"""modforge models in lm-evaluation-harness: :class:`ModforgeLM`, its ``LM`` interface (optional extra
``modforge[evals]``).

Any of the harness's tasks whose dataset is in the local cache runs on a modforge checkpoint::

    python -m modforge eval ckpt=outputs/<run> harness=hellaswag,arc_easy limit=200

or from Python, where the harness's own options are all at hand::

    import lm_eval
    from modforge.harness import ModforgeLM
    lm_eval.simple_evaluate(model=ModforgeLM(ckpt="outputs/<run>"), tasks=["hellaswag"])

Log-likelihoods are computed as :mod:`modforge.evals.scoring` computes them (the harness's ``_encode_pair``
split, the end-of-text id before an empty context, rolling windows with one token of context); generation is
greedy, cut at the first of the request's ``until`` strings.
"""
from typing import Any, Optional

from modforge.errors import ConfigError
from modforge.evals.scoring import encode_pair, loglikelihoods, rolling_loglikelihood

EVALS_INSTALL = "pip install 'modforge[evals]'  (or: pip install 'lm-eval>=0.4.3')"

try:
    from lm_eval.api.model import LM
    from lm_eval.api.registry import register_model
except ImportError:  # the optional extra is not installed: the class below cannot be made
    LM, register_model = None, None


def require_harness() -> None:
    if LM is None:
        raise ConfigError(f"lm-evaluation-harness is not installed: {EVALS_INSTALL}")


if LM is not None:

    @register_model("modforge")
    class ModforgeLM(LM):
        """A trained modforge causal model (``task``, or the checkpoint ``ckpt``) as the harness's ``LM``."""

        def __init__(self, ckpt: Optional[str] = None, task: Any = None, device: str = "cpu", batch_size: int = 16,
                     max_gen_toks: int = 256):
            super().__init__()
            if task is None:
                from modforge.checkpoints.files import find_checkpoint, load_checkpoint

                task = load_checkpoint(str(find_checkpoint("ckpt", ckpt)), map_location=device)
            if not getattr(task.model, "can_generate", False):
                raise ConfigError(f"ckpt={ckpt}: a {type(task.model).__name__} is not a causal language model; "
                                  "the harness scores decoder-only models")
            self.task = task.to(device).eval()
            self.model, self.tok = self.task.model, self.task.tokenizer
            self.max_len = self.task.context_len
            try:
                self.batch_size, self.max_gen_toks = int(batch_size), int(max_gen_toks)
            except (TypeError, ValueError):
                raise ConfigError(f"batch_size={batch_size}, max_gen_toks={max_gen_toks}: whole numbers (modforge's "
                                  "adapter has no batch_size=auto)") from None
            self._device = device

        @classmethod
        def create_from_arg_string(cls, arg_string: str, additional_config: Optional[dict] = None) -> "ModforgeLM":
            from lm_eval.utils import simple_parse_args_string

            args = simple_parse_args_string(arg_string)
            extra = {k: v for k, v in (additional_config or {}).items() if v is not None and k in ("device",
                                                                                                  "batch_size")}
            return cls(**{**args, **extra})

        @property
        def eot_token_id(self) -> int:
            return self.tok.eos_id

        def loglikelihood(self, requests, disable_tqdm: bool = False) -> list:
            pairs = [encode_pair(self.tok, r.args[0], r.args[1], self.eot_token_id) for r in requests]
            return loglikelihoods(self.model, pairs, self.max_len, self.batch_size, self._device)

        def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list:
            return [rolling_loglikelihood(self.model, self.tok.encode(r.args[0]), self.eot_token_id, self.max_len,
                                          self.batch_size, self._device) for r in requests]

        def generate_until(self, requests, disable_tqdm: bool = False) -> list:
            from modforge.models.decoding import generate

            out = []
            for r in requests:
                context, kwargs = r.args[0], dict(r.args[1] or {})
                until = kwargs.get("until") or []
                until = [until] if isinstance(until, str) else list(until)
                text = generate(self.model, self.tok, prompt=context, strategy="greedy",
                                max_new=int(kwargs.get("max_gen_toks", self.max_gen_toks)),
                                max_context=self.max_len)
                cut = min([text.index(u) for u in until if u and u in text] or [len(text)])
                out.append(text[:cut])
            return out
