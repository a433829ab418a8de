"""The condition cache's digests of model inputs (stylevar.pipelines.conditions.ImageDigest): they tell inputs apart
on the host and on a device, the device's are exact, and on a device only a few numbers per image come to the host."""
from __future__ import annotations

import pytest
import torch

from stylevar.pipelines import conditions
from stylevar.pipelines.conditions import DIGEST_HASHES, DIGEST_MODULUS, ConditionCache, ImageDigest


def batch(seed: int = 0, shape=(4, 3, 16, 12)) -> torch.Tensor:
    return torch.rand(shape, generator=torch.Generator().manual_seed(seed)) * 2 - 1


@pytest.fixture(params=["host", "device"])
def digest(request, monkeypatch):
    if request.param == "device":  # the device's path, run on CPU tensors
        monkeypatch.setattr(conditions, "_on_host", lambda images: False)
    return ImageDigest(key=7)


def test_equal_inputs_share_a_digest_and_any_change_is_another(digest):
    x = batch()
    x[2] = x[0]
    d = digest(x)
    assert d[0] == d[2] and len(set(d)) == 3
    nudged = x.clone()
    nudged[1, 2, 15, 11] = torch.nextafter(nudged[1, 2, 15, 11], torch.tensor(2.0))  # one ulp of one value
    assert digest(nudged)[1] != d[1] and digest(nudged)[0] == d[0]
    assert digest(x.reshape(4, 3, 12, 16))[0] != d[0], "the shape is part of the digest"
    assert digest(x.view(torch.int32))[0] != d[0], "the dtype is part of the digest"


def test_the_device_residues_are_exact_across_chunks(monkeypatch):
    """sum_i b_i a_ki mod p in whole numbers (int64, here) equals the float64 products and chunk sums the device
    computes; chunks of 100 bytes make a row's 2,304 bytes 24 chunks, the last one padded."""
    monkeypatch.setattr(conditions, "DIGEST_CHUNK", 100)
    x = batch(1, (2, 3, 16, 12))
    digest = ImageDigest(key=11)
    got = digest.residues(x)
    n = 3 * 16 * 12 * 4
    C = -(-n // 100)
    coeff = torch.randint(0, DIGEST_MODULUS, (C, 100, DIGEST_HASHES), generator=torch.Generator().manual_seed(11),
                          dtype=torch.float64).long().view(C * 100, DIGEST_HASHES)[:n]
    want = torch.stack([(row.view(torch.uint8).long()[:, None] * coeff).sum(0) % DIGEST_MODULUS
                        for row in x.reshape(2, -1)])
    assert torch.equal(got, want)
    assert not torch.equal(ImageDigest(key=12).residues(x), got), "another key, other residues"


class HostBytes:
    """Bytes of tensors brought to the host (`.cpu()`, `.to(cpu)`, `.numpy()`, `.tolist()`, `.item()`)."""

    def __init__(self, monkeypatch):
        self.copies: list[int] = []
        for name in ("cpu", "numpy", "tolist", "item"):
            monkeypatch.setattr(torch.Tensor, name, self._counted(getattr(torch.Tensor, name)))
        real_to = torch.Tensor.to

        def to(t, *args, **kwargs):
            target = kwargs.get("device", args[0] if args else None)
            if isinstance(target, (str, torch.device)) and torch.device(target).type == "cpu":
                self.copies.append(t.numel() * t.element_size())
            return real_to(t, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, "to", to)

    def _counted(self, real):
        def call(t, *args, **kwargs):
            self.copies.append(t.numel() * t.element_size())
            return real(t, *args, **kwargs)
        return call


def test_on_a_device_only_five_numbers_an_image_come_to_the_host(monkeypatch):
    """Issue 60, point 10: every model input was copied to the host to be hashed (a copy and a wait per image).
    On a device (its path run on CPU tensors) one batch brings B x 5 residues over, once."""
    monkeypatch.setattr(conditions, "_on_host", lambda images: False)
    cache = ConditionCache(1 << 20)
    x = batch(2)
    host = HostBytes(monkeypatch)
    out = cache.rows("style", (), x, lambda images: (images.mean((1, 2, 3)),))
    assert torch.equal(out[0], x.mean((1, 2, 3)))
    assert host.copies == [4 * DIGEST_HASHES * 8], host.copies
