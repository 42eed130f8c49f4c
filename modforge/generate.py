"""``python -m modforge.generate ckpt=<path> prompt="..." [src="..."] [strategy=greedy|beam|sample] ...``

Rebuilds model and tokenizer from the checkpoint alone and prints the
generated text.

Examples:
  python -m modforge.generate ckpt=outputs/<date>/<time> prompt="def main(" max_new=100
  python -m modforge.generate ckpt=outputs/<date>/<time> prompt="ROMEO:" strategy=sample temperature=0.8 top_k=40
  python -m modforge.generate ckpt=outputs/<date>/<time> src="0412" strategy=beam beam_size=4   (encoder_decoder)
"""
from dataclasses import dataclass
from typing import Optional

from modforge import registry
from modforge.cli.command import command
from modforge.cli.options import Option, Options, missing
from modforge.models.decoding import STRATEGIES, generate

# the most tokens one command generates. Past its context a model decodes on (the window slides), so the context
# bounds nothing; but the text comes out only at the end and every step copies all of it so far: a number far
# beyond this one is a slip (digits too many), not a text anyone waits for
MAX_NEW = 100_000
OPTIONS = Options("python -m modforge.generate", (
    Option("ckpt", "a checkpoint file or a run directory, e.g. outputs/<date>/<time> (its checkpoints/last.ckpt)",
           required=True, metavar="run dir or .ckpt"),
    Option("prompt", "text to continue (decoder_only), or a forced target prefix (encoder_decoder)", ""),
    Option("src", "source text (encoder_decoder models)"),
    Option("strategy", "how tokens are chosen", "greedy", "choice", STRATEGIES),
    Option("max_new", f"tokens to generate, at most {MAX_NEW}", 200, "int"),
    Option("beam_size", "beams (strategy=beam)", 4, "int"),
    Option("length_penalty", "a finished beam's score is divided by length ** this (strategy=beam)", 1.0, "float"),
    Option("temperature", "the logits are divided by it (strategy=sample)", 1.0, "float"),
    Option("top_k", "sample from the k likeliest tokens only; 0: off (strategy=sample)", 0, "int"),
    Option("top_p", "sample from the smallest set of tokens this likely; 1: off (strategy=sample)", 1.0, "float"),
    Option("seed", "the first sample's seed; the next ones count up (strategy=sample)", 0, "int"),
    Option("num_samples", "independent samples to print (strategy=sample)", 1, "int"),
    Option("device", "where the model runs: cpu, cuda, cuda:1, mps", "cpu"),
))
STRATEGY_KEYS = {"beam_size": ("beam",), "length_penalty": ("beam",), "temperature": ("sample",),
                 "top_k": ("sample",), "top_p": ("sample",), "seed": ("sample",), "num_samples": ("sample",)}


@dataclass
class GenerateConfig:
    """A generate command's options, as :data:`OPTIONS` declares them (their defaults are there)."""

    ckpt: str
    prompt: str
    src: Optional[str]
    strategy: str
    max_new: int
    beam_size: int
    length_penalty: float
    temperature: float
    top_k: int
    top_p: float
    seed: int
    num_samples: int
    device: str


def parse(argv: list) -> GenerateConfig:
    given, _ = OPTIONS.parse(argv)  # every value verbatim or typed: '${...}' in a prompt is text, not a reference
    cfg = GenerateConfig(**given)
    if not cfg.ckpt:
        raise missing(OPTIONS.options[0])
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
    unread = [k for k, strategies in STRATEGY_KEYS.items() if k in given.given and cfg.strategy not in strategies]
    if unread:  # a setting the chosen strategy never reads would be ignored without a word
        k = unread[0]
        raise registry.ConfigError(f"{k}={given.given[k]}: strategy={cfg.strategy} does not read it (it is for "
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
    command(__doc__, generate_command, argv, OPTIONS)


if __name__ == "__main__":
    main()
