"""benchmarks/gpu.py without a GPU: the plan and "nothing measured"; its smoke run on CPU writes the record."""
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

import gpu  # noqa: E402


def test_without_cuda_the_check_prints_its_plan_and_measures_nothing(capsys, tmp_path, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert gpu.main(["--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.rstrip().endswith("no GPU: nothing measured")
    assert all(name in out for name, _ in gpu.PLAN) and not list(tmp_path.iterdir())


def test_the_smoke_run_writes_the_record_and_its_table(tmp_path, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    code = gpu.main(["--smoke", "--out", str(tmp_path), "--only", "throughput", "fused_adamw"])
    rec = json.loads((tmp_path / "gpu.json").read_text())
    assert code == 0 and set(rec) == {"device", "command", "seconds", "checks"}
    assert {"name", "torch", "cuda", "driver", "date", "peak_bf16_tflops"} <= set(rec["device"])
    by = {c["name"]: c for c in rec["checks"]}
    assert by["fused_adamw"]["result"] == "SKIP" and by["fused_adamw"]["figure"] == "needs CUDA"
    (row,) = by["throughput"]["data"]["rows"]
    assert by["throughput"]["result"] == "PASS" and row["modforge"]["tokens_per_s"] > 0 and row["flops_per_step"] > 0
    assert row["modforge"]["mfu"] is None  # no datasheet peak for a CPU
    md = (tmp_path / "gpu.md").read_text()
    assert md.startswith("# GPU check: cpu") and "| throughput | PASS |" in md and "| fused_adamw | SKIP | needs CUDA |" in md


@pytest.mark.parametrize("name, peak", [("NVIDIA H100 80GB HBM3", 989.4), ("NVIDIA H100 PCIe", 756.0),
                                        ("NVIDIA H200", 989.4), ("Tesla T4", None)])
def test_the_datasheet_peak_is_the_device_s(name, peak):
    assert next((t for key, t, _ in gpu.PEAKS if key in name), None) == peak
