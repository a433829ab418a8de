"""benchmarks/gpu_peaks.py: the bf16 peak of a GPU, picked by its name (the fast lane runs this, no GPU needed)."""
from __future__ import annotations

import pytest

from benchmarks.gpu_peaks import peak_tflops


@pytest.mark.parametrize(("name", "peak"), [("NVIDIA H100 80GB HBM3", 989.0), ("NVIDIA H100 PCIe", 756.0),
                                            ("NVIDIA H200", 989.0), ("NVIDIA A100-SXM4-80GB", 312.0),
                                            ("NVIDIA L4", 121.0), ("NVIDIA L40S", 362.0), ("Tesla T4", None)])
def test_the_peak_is_picked_by_the_gpus_name(name, peak):
    assert peak_tflops(name) == peak
