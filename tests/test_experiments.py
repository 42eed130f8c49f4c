"""experiments/recheck_cells.py: the "Reproducing a cell" table quotes only values its studies committed."""
import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _recheck():
    spec = importlib.util.spec_from_file_location("recheck_cells", ROOT / "experiments" / "recheck_cells.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_every_value_in_the_reproducing_table_is_in_a_committed_report():
    recheck = _recheck()
    rows = recheck.rows()
    assert {"norms", "ffn_variants", "prepost_ln", "positions", "norm_quick"} <= {r["study"] for r in rows}
    for r in rows:
        assert r["report"].exists(), r["report"]
        assert r["values"] and all(recheck.committed(r).values()), (r["study"], r["values"])


def test_a_value_off_by_one_digit_is_caught(tmp_path):
    recheck = _recheck()
    row = next(r for r in recheck.rows() if r["study"] == "norms")
    metric, text = next(iter(row["values"].items()))
    i = text.index(".") + 6  # the sixth decimal: a difference the 1e-6 promise is about (the 17th digit may round away)
    wrong = text[:i] + str((int(text[i]) + 1) % 10) + text[i + 1:]
    readme = tmp_path / "README.md"
    readme.write_text(f"# x\n\n{recheck.TABLE_HEADING}\n\n| study | cell | value |\n|---|---|---|\n"
                      f"| [norms]({row['report']}) | `{row['command']}` | {metric} {wrong} |\n")
    (tampered,) = recheck.rows(readme)
    assert tampered["values"] == {metric: wrong}
    assert recheck.committed(tampered) == {metric: False}
    assert recheck.committed(row) == {metric: True}
