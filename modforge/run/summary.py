"""What a run prints when it ends, and what ``init_from=`` loaded: the lines a user reads."""
from pathlib import Path

from modforge.utils.console import say

def say_init(r: dict) -> None:
    """What ``init_from=`` loaded, exactly: loaded are all the model's tensors not listed as new."""
    total = len(r["loaded"]) + len(r["new"])
    say(f"[modforge] init_from={r['checkpoint']}: loaded {len(r['loaded'])} of the model's {total} tensors "
        "(same name and shape in the checkpoint)")
    say(f"  new, initialised by their components: {', '.join(r['new']) or 'none'}")
    say(f"  dropped, in the checkpoint only: {', '.join(r['dropped']) or 'none'}")
    if r["reshaped"]:
        say(f"  of those, another shape here: {', '.join(r['reshaped'])}")

def print_summary(m: dict, out_dir: Path) -> None:
    names = " ".join(f"{k}={v}" for k, v in m["config"].items())
    lines = ["", f"== modforge run: {names}"]
    val = "  ".join(f"{k}={v:.4f}" for k, v in sorted(m["val"].items()))
    if m.get("diverged_at_step") is not None:
        last = m.get("last_finite_train") or {}
        lines.append(f"   DIVERGED   at step {m['diverged_at_step']}: the training loss was not finite "
                 f"(last finite: {last.get('train/loss', float('nan')):.4f} at step {last.get('step', '-')}); stopped")
        lines.append(f"   last finite validation (step {m.get('val_step', '-')}): {val or 'none'}")
    else:
        lines.append(f"   {m['status']:<10} {val}")
    for what, why in (m.get("not_applicable") or {}).items():
        lines.append(f"   {what}: not applicable: {why}")
    if m.get("val_loss_at_start") is not None:
        extra = f" (unigram model: {m['unigram_val_loss']:.4f})" if "unigram_val_loss" in m else ""
        lines.append(f"   at start   val/loss={m['val_loss_at_start']:.4f}{extra}")
    tps = m["tokens_per_sec"]
    resumed = f", resumed at step {', '.join(map(str, m['resumed_at_steps']))}" if m.get("resumed_at_steps") else ""
    lines.append(f"   {m['params']:,} parameters (FFN hidden width {m['ffn_hidden']}), {m['steps']} steps, {m['tokens_seen']:,} tokens, "
          f"{m['train_seconds']:.1f} s training ({tps or 0:,.0f} tokens/s), {m['wall_seconds']:.1f} s wall{resumed}")
    if m.get("parametrisation"):
        lines.append(f"   {m['parametrisation']}")
    if m.get("sample"):
        lines.append("   sample:\n" + "\n".join("   | " + line for line in m["sample"].splitlines()))
    lines.append(f"   outputs: {out_dir}")
    say("\n".join(lines))
