"""µP's coordinate check from the command line (modforge/models/coordcheck.py): per layer, the slope of its
output's size against width, under param=standard, param=mup and param=umup, for the parts given (umup at its own
learning rate, --umup-lr: its rates sit near 1, Blake et al. 2024).

    python benchmarks/mup_coord.py
    python benchmarks/mup_coord.py ffn=swiglu pos=rope norm=rms --widths 32,64,128,256,512
"""
import argparse
from typing import Optional

from modforge.models.coordcheck import slopes
from modforge.plugins import load_all


def main(argv: Optional[list] = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("parts", nargs="*", help="part=option, e.g. ffn=swiglu")
    ap.add_argument("--widths", default="32,64,128,256")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--lr", type=float, default=1e-2)
    ap.add_argument("--umup-lr", type=float, default=0.5)
    a = ap.parse_args(argv)
    load_all()
    parts = dict(p.split("=", 1) for p in a.parts)
    widths = [int(w) for w in a.widths.split(",")]
    print(f"slope of log(mean |x|) against log(width), widths {widths} (mup base {widths[0]}), "
          f"{a.steps} AdamW steps at lr {a.lr} (umup {a.umup_lr}); parts {parts or 'default'}")
    rows = {name: slopes(name, widths, parts=parts, steps=a.steps, lr=a.umup_lr if name == "umup" else a.lr,
                         base=widths[0]) for name in ("standard", "mup", "umup")}
    keys = list(rows["mup"])
    print(f"{'layer':14s}" + "".join(f"{n:>10s}" for n in rows))
    for k in keys:
        print(f"{k:14s}" + "".join(f"{rows[n][k]:10.2f}" for n in rows))


if __name__ == "__main__":
    main()
