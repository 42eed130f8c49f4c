"""The number checker (issue 51, item 7): every precise figure a write-up quotes is in a committed file.

A *precise figure* is a decimal with three or more digits after the point (1.5738, −0.0342, 0.000999): what a
reader would copy. Each must equal, at the digits quoted, a number in the committed results the write-up rests
on: ``experiments/results/<stem>*/`` (its study's report, tables, state notes), the results of every study
whose write-up it links (a "before and after" quotes them), and the top-level results files
(``recheck_cells.md``, ``decision_accuracy.md``). Numbers in the "Claim and its source" section, or in a
paragraph that begins "**Claim...", are exempt: they quote papers (the reference documents), not runs.

A figure computed in prose (a difference of two reported means, an sd of paired differences) carries its
derivation in a comment the page does not show, after the paragraph or list that quotes it (a comment line
inside a paragraph would split it when rendered)::

    <!-- check: 0.056 = 2.3081 - 2.2518 -->
    <!-- check: 0.0119 = sd(2.3597 - 2.3538, 2.3580 - 2.3494, ...) -->

The expression (numbers, + - * / **, ``sd``, ``mean``, ``sqrt``, ``tq(p, df)``: the t quantile) is evaluated here; every precise number in it
must itself be in a committed file, and the result must round to the figure at its digits.

    python experiments/check_numbers.py            # every write-up: the misses, and a summary
    python experiments/check_numbers.py ladder_ffn # one write-up

Exit code 1 when a write-up listed in :data:`CHECKED` has a miss (the slow test runs exactly that). What it
proves is one-sided: a figure no committed file holds is caught, and a derivation that does not give its figure;
a figure that equals some committed number by chance passes without naming its source.
"""
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent
RESULTS = ROOT / "results"
TEXT = (".json", ".md", ".csv", ".txt")
PRECISE = re.compile(r"(?<![\w.])([−-]?)(\d+\.\d{3,})(?![\d])")
ANY = re.compile(r"-?\d+\.\d+(?:[eE][-+]?\d+)?")
LINK = re.compile(r"\]\(([a-z0-9_]+)\.md[)#]")
# write-ups whose every precise figure is found (the slow test keeps them so); the others are being checked
CHECKED = ("architectures", "ffn_variants", "norm_quick", "mup_ladder", "shakespeare_char", "ladder_ffn", "ladder_norms", "qk_norm_stability", "norms", "prepost_ln", "mup_transfer", "mup_depth", "positions")


def writeups() -> list:
    return sorted(p for p in ROOT.glob("*.md") if p.name != "README.md")


def quoted(text: str) -> list:
    """(line number, figure as written) of the precise figures outside the "Claim and its source" section and
    outside check comments."""
    out, skip, claim_par = [], False, False
    for n, line in enumerate(CHECK.sub("", text).splitlines(), 1):
        if line.startswith("## "):
            skip = line.strip().lower().startswith("## claim")
        if line.startswith("**Claim"):  # a paragraph of claims and their sources (a page with no such section)
            claim_par = True
        elif not line.strip():
            claim_par = False
        if skip or claim_par:
            continue
        for m in PRECISE.finditer(line):
            out.append((n, ("-" if m.group(1) else "") + m.group(2)))
    return out


def pool(stem: str, text: str) -> set:
    """Every number in the committed files the write-up ``stem`` rests on (as floats)."""
    stems = {stem, *LINK.findall(text)}
    files = [f for s in stems for d in RESULTS.glob(s + "*") if d.is_dir() for f in d.rglob("*") if f.suffix in TEXT]
    files += list(RESULTS.glob("*.md"))
    out = set()
    for f in files:
        for m in ANY.finditer(f.read_text(encoding="utf-8", errors="replace")):
            try:
                out.add(float(m.group(0)))
            except ValueError:
                pass
    return out


CHECK = re.compile(r"<!--\s*check:\s*([−-]?\d+\.\d+)\s*=\s*(.+?)\s*-->")


def evaluate(expr: str) -> float:
    """An arithmetic expression over numbers, with sd (sample), mean, sqrt and tq(p, df) (Student's t quantile,
    for an interval's half-width): nothing else is evaluated."""
    import ast
    import math
    import statistics

    from scipy.stats import t as tdist

    funcs = {"sd": lambda *v: statistics.stdev(v), "mean": lambda *v: statistics.fmean(v), "sqrt": math.sqrt,
             "tq": lambda p, df: float(tdist.ppf(p, df))}
    ops = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b,
           ast.Div: lambda a, b: a / b, ast.Pow: lambda a, b: a ** b}

    def ev(node):
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return float(node.value)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -ev(node.operand)
        if isinstance(node, ast.BinOp) and type(node.op) in ops:
            return ops[type(node.op)](ev(node.left), ev(node.right))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in funcs:
            return funcs[node.func.id](*(ev(a) for a in node.args))
        raise ValueError(f"not allowed in a check: {ast.dump(node)[:60]}")

    return ev(ast.parse(expr.replace("−", "-"), mode="eval").body)


def derived(text: str, numbers: set) -> tuple:
    """({figures a check comment derives and verifies}, [(figure, why) of the checks that fail])."""
    ok, bad = set(), []
    for m in CHECK.finditer(text):
        fig, expr = m.group(1).replace("−", "-"), m.group(2)
        operands = [x.group(0) for x in PRECISE.finditer(expr)]
        missing = [x for x in operands if not found(x.replace("−", "-"), numbers)]
        try:
            value = evaluate(expr)
        except (ValueError, SyntaxError, ZeroDivisionError) as e:
            bad.append((fig, f"cannot evaluate {expr!r}: {e}"))
            continue
        digits = len(fig.split(".")[1])
        if missing:
            bad.append((fig, f"operand(s) {', '.join(missing)} not in a committed file"))
        elif abs(value - float(fig)) > 0.5 * 10 ** -digits + 1e-12:
            bad.append((fig, f"{expr} = {value:.6g}, not {fig}"))
        else:
            ok.add(fig)
    return ok, bad


def found(figure: str, numbers: set) -> bool:
    digits = len(figure.split(".")[1])
    x = round(float(figure), digits)
    return any(round(v, digits) == x or round(-v, digits) == x for v in numbers)


def misses(path: Path) -> list:
    text = path.read_text(encoding="utf-8")
    numbers = pool(path.stem, text)
    ok, bad = derived(text, numbers)
    return [(n, f) for n, f in quoted(text) if f not in ok and not found(f, numbers)] + \
        [(0, f"{fig} ({why})") for fig, why in bad]


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    paths = [ROOT / f"{a}.md" for a in argv] if argv else writeups()
    bad_checked, total, missed = [], 0, 0
    for p in paths:
        m = misses(p)
        total += len(quoted(p.read_text(encoding="utf-8")))
        missed += len(m)
        mark = "checked" if p.stem in CHECKED else "not yet"
        print(f"{p.name}: {len(m)} figure(s) not in a committed file ({mark})")
        for n, f in m:
            print(f"  line {n}: {f}")
        if m and p.stem in CHECKED:
            bad_checked.append(p.name)
    print(f"{total - missed} of {total} precise figures found in committed files; "
          f"{len([p for p in paths if p.stem in CHECKED])} write-up(s) held to it")
    return 1 if bad_checked else 0


if __name__ == "__main__":
    sys.exit(main())
