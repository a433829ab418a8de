"""Device "auto" on a machine whose GPU torch cannot use (a driver older than torch's CUDA build needs): the run
goes to the CPU with one warning naming the cause, never silently (issue 60, point 9). The failure is simulated."""
from __future__ import annotations

import logging

import pytest
import torch

from stylevar.utils import devices

TOO_OLD = ("The NVIDIA driver on your system is too old (found version 12040). Please update your GPU driver by "
           "downloading and installing a new version from the URL: http://www.nvidia.com/Download/index.aspx")


def _cuda_init_fails() -> None:
    raise RuntimeError(TOO_OLD)


@pytest.fixture
def gpu_unusable(monkeypatch):
    monkeypatch.setattr(devices, "_gpu_nodes", lambda: ["/dev/nvidia0", "/dev/nvidiactl"])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "init", _cuda_init_fails)


def test_auto_warns_when_a_gpu_is_present_but_cuda_cannot_be_used(gpu_unusable, caplog):
    with caplog.at_level(logging.WARNING, logger="stylevar.utils.devices"):
        assert devices.resolve_devices(["auto"]) == [torch.device("cpu")]
    [record] = [r for r in caplog.records if r.name == "stylevar.utils.devices"]
    assert record.levelno == logging.WARNING
    text = record.getMessage()
    assert "running on the CPU" in text and "driver on your system is too old (found version 12040)" in text
    assert torch.__version__ in text and f"CUDA {torch.version.cuda}" in text and "/dev/nvidia0" in text


def test_no_device_name_warns_too(gpu_unusable, caplog):
    with caplog.at_level(logging.WARNING, logger="stylevar.utils.devices"):
        assert devices.resolve_device(None) == torch.device("cpu")
    assert any("too old" in r.getMessage() for r in caplog.records)


def test_no_warning_without_a_gpu_or_for_an_explicit_cpu(monkeypatch, caplog):
    monkeypatch.setattr(devices, "_gpu_nodes", lambda: [])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with caplog.at_level(logging.WARNING, logger="stylevar.utils.devices"):
        assert devices.resolve_devices(["auto"]) == [torch.device("cpu")]
        assert devices.resolve_devices(["cpu"]) == [torch.device("cpu")]
    assert not [r for r in caplog.records if r.name == "stylevar.utils.devices"]
    assert devices.cuda_unusable_reason() is None
