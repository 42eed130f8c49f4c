"""``python -m modforge.generate ckpt=<path> prompt="..." [src="..."] [strategy=greedy|beam|sample] ...``

Rebuilds model and tokenizer from the checkpoint alone and prints the
generated text. Keys (``key=value``, any order, each once):

  ckpt            a checkpoint file or a run directory (required), e.g. outputs/<date>/<time> (its checkpoints/last.ckpt)
  prompt          text to continue (decoder_only), or a forced target prefix (encoder_decoder)
  src             source text (encoder_decoder models)
  strategy        greedy | beam | sample                       (default greedy)
  max_new         tokens to generate, at most 100000           (default 200)
  beam_size, length_penalty                                     (beam; 4, 1.0)
  temperature, top_k, top_p, seed                               (sample; 1.0, 0 = off, 1.0 = off, 0)
  num_samples     independent samples to print                  (sample; 1)

Examples:
  python -m modforge.generate ckpt=outputs/<date>/<time> prompt="def main(" max_new=100
  python -m modforge.generate ckpt=outputs/<date>/<time> prompt="ROMEO:" strategy=sample temperature=0.8 top_k=40
  python -m modforge.generate ckpt=outputs/<date>/<time> src="0412" strategy=beam beam_size=4   (encoder_decoder)
"""
from dataclasses import dataclass
from typing import Optional

from omegaconf import OmegaConf

from modforge import registry
from modforge.cli.command import command, key_values
from modforge.models.decoding import STRATEGIES, generate


@dataclass
class GenerateConfig:
    ckpt: Optional[str] = None
    prompt: str = ""
    src: Optional[str] = None
    strategy: str = "greedy"
    max_new: int = 200
    beam_size: int = 4
    length_penalty: float = 1.0
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0
    num_samples: int = 1
    device: str = "cpu"


RAW_TEXT = ("prompt", "src", "ckpt")
# the most tokens one command generates. Past its context a model decodes on (the window slides), so the context
# bounds nothing; but the text comes out only at the end and every step copies all of it so far: a number far
# beyond this one is a slip (digits too many), not a text anyone waits for
MAX_NEW = 100_000
STRATEGY_KEYS = {"beam_size": ("beam",), "length_penalty": ("beam",), "temperature": ("sample",),
                 "top_k": ("sample",), "top_p": ("sample",), "seed": ("sample",), "num_samples": ("sample",)}


def parse(argv: list) -> GenerateConfig:
    allowed = list(GenerateConfig.__dataclass_fields__)
    given = key_values(argv, allowed, f"key=value with key one of {', '.join(allowed)}")
    text = {k: given.pop(k) for k in RAW_TEXT if k in given}  # verbatim: '${...}' in a prompt is text, not a reference
    try:
        # OmegaConf converts and type-checks the other values
        cfg = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(GenerateConfig), given))
    except Exception as e:  # noqa: BLE001 - OmegaConf type errors -> one line
        key = getattr(e, "full_key", None)
        raise registry.ConfigError((f"{key}: " if key else "") + str(e).splitlines()[0]) from None
    for k, v in text.items():
        setattr(cfg, k, v)
    if not cfg.ckpt:
        raise registry.ConfigError("ckpt=<a .ckpt file or a run directory> is required")
    if cfg.strategy not in STRATEGIES:
        raise registry.ConfigError(
            f"strategy={cfg.strategy}: allowed values are {', '.join(STRATEGIES)}.{registry.suggest(cfg.strategy, list(STRATEGIES))}"
        )
    import math

    for key, ok, allowed in (
        ("max_new", 1 <= cfg.max_new <= MAX_NEW, f"an integer in [1, {MAX_NEW}] (the text is printed only when "
                                                   "generation ends)"),
        ("beam_size", cfg.beam_size >= 1, "an integer >= 1 (1 is greedy)"),
        ("seed", 0 <= cfg.seed and cfg.seed + cfg.num_samples <= 2 ** 32, "in [0, 2^32 - num_samples]"),
        ("temperature", 0 < cfg.temperature < math.inf, "a number > 0 (lower is sharper; use strategy=greedy for argmax)"),
        ("top_k", cfg.top_k >= 0, "an integer >= 0 (0: off)"),
        ("top_p", 0 < cfg.top_p <= 1, "a number in (0, 1] (1: off)"),
        ("num_samples", cfg.num_samples >= 1, "an integer >= 1"),
        ("length_penalty", 0 <= cfg.length_penalty < math.inf, "a finite number >= 0 (0: none)"),
    ):
        if not ok:
            raise registry.ConfigError(f"{key}={getattr(cfg, key)}: must be {allowed}")
    unread = [k for k, strategies in STRATEGY_KEYS.items() if k in given and cfg.strategy not in strategies]
    if unread:  # a setting the chosen strategy never reads would be ignored without a word
        k = unread[0]
        raise registry.ConfigError(f"{k}={given[k]}: strategy={cfg.strategy} does not read it (it is for "
                                   f"strategy={' or '.join(STRATEGY_KEYS[k])}); drop it or change strategy=")
    import torch

    try:
        device = torch.device(cfg.device)
    except RuntimeError:
        raise registry.ConfigError(f"device={cfg.device}: not a device name (cpu, cuda, cuda:1, mps)") from None
    available = {"cpu": True, "cuda": torch.cuda.is_available(), "mps": torch.backends.mps.is_available()}
    if not available.get(device.type, False):
        what = "no CUDA GPU is visible here" if device.type == "cuda" else f"no {device.type} device is usable here"
        raise registry.ConfigError(f"device={cfg.device}: {what}; use device=cpu")
    return cfg


def check_vocabulary(tokenizer, text: str, key: str) -> None:
    """Characters the model's tokenizer cannot represent would silently become <unk>: name them instead."""
    ids = tokenizer.encode(text)
    if tokenizer.unk_id in ids:
        lost = sorted({ch for ch in text if tokenizer.unk_id in tokenizer.encode(ch)})
        raise registry.ConfigError(
            f"{key}= holds characters this model's vocabulary does not have: {' '.join(repr(c) for c in lost)} "
            "(they would be read as <unk>); leave them out")
    dropped = sorted({ch for ch in text if not ch.isspace() and not tokenizer.encode(ch)})
    if dropped:  # a pretrained BPE without an unknown token drops what it cannot encode, without a word
        raise registry.ConfigError(
            f"{key}= holds characters this model's tokenizer cannot encode: {' '.join(repr(c) for c in dropped)} "
            "(it would drop them silently); leave them out")


def run(cfg: GenerateConfig) -> list[str]:
    from modforge.checkpoints.files import find_checkpoint, load_checkpoint, non_finite_weight

    path = find_checkpoint("ckpt", cfg.ckpt)
    task = load_checkpoint(str(path), map_location=cfg.device).to(cfg.device)  # a mismatch: one line
    bad = non_finite_weight(task)
    if bad:  # every logit would be NaN: argmax picks token 0, sampling fails; nothing it printed would mean a thing
        raise registry.ConfigError(f"ckpt={path}: its weight {bad} holds non-finite values (NaN or inf); "
                                   "generate from a checkpoint whose weights are finite")
    check_vocabulary(task.tokenizer, cfg.prompt, "prompt")
    if cfg.src:
        check_vocabulary(task.tokenizer, cfg.src, "src")
    n = cfg.num_samples if cfg.strategy == "sample" else 1
    return [
        generate(task.model, task.tokenizer, prompt=cfg.prompt, src=cfg.src, strategy=cfg.strategy,
                 max_new=cfg.max_new, beam_size=cfg.beam_size, length_penalty=cfg.length_penalty,
                 temperature=cfg.temperature, top_k=cfg.top_k or None, top_p=cfg.top_p, seed=cfg.seed + i,
                 max_context=task.context_len)
        for i in range(n)
    ]


def generate_command(argv: list) -> None:
    cfg = parse(argv)
    outs = run(cfg)
    for i, text in enumerate(outs):
        if len(outs) > 1:
            print(f"--- sample {i + 1}")
        print(cfg.prompt + text)


def main(argv: Optional[list] = None) -> None:
    command(__doc__, generate_command, argv)


if __name__ == "__main__":
    main()
