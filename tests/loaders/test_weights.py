"""The weight registry: lookup, errors, layout checks, and fetching from a local HTTP server (no internet)."""
from __future__ import annotations

import functools
import hashlib
import http.server
import threading
import zipfile
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from serve.testing import free_port
from stylevar.loaders.hub import home
from stylevar.loaders import weights
from stylevar.cli import main
from stylevar.loaders.hub import HubFile
from stylevar.models.state_dict import WeightMismatchError, load_into, read_state_dict
from tests.conftest import set_hf_env


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def server(tmp_path):
    """A local HTTP server over a folder; yields (folder, base URL)."""
    root = tmp_path / "served"
    root.mkdir()
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(root)))
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield root, f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        thread.join()


def _zip(path: Path, files: dict[str, bytes]) -> None:
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in files.items():
            zf.writestr(name, data)


def test_registry_covers_the_issue_list():
    expected = {
        "vgg19": "vgg19-dcbb9e9d.pth", "vgg16": "vgg16-397923af.pth", "alexnet": "alexnet-owt-7be5be79.pth",
        "resnet18": "resnet18-f37072fd.pth", "adain_vgg": "vgg_normalised.pth", "adain_decoder": "decoder.pth",
        "var_vae": "vae_ch160v4096z32.pth", "var_d16": "var_d16.pth", "var_d20": "var_d20.pth",
        "var_d24": "var_d24.pth", "var_d30": "var_d30.pth", "stylevar_sft": "StyleVAR_SFT.pth",
        "stylevar_grpo": "StyleVAR-GRPO.pth", "dreamsim": "dreamsim",
        "clip": "open_clip/ViT-B-32-openai/open_clip_model.safetensors",
    }
    assert {k: weights.get(k).filename for k in expected} == expected
    assert weights.get("vgg19").parts[0].sha256_prefix == "dcbb9e9d"
    assert weights.get("var_d20").hub_file == HubFile("FoundationVision/var", "var_d20.pth")
    assert weights.get("stylevar_sft").hub_file == HubFile("Senfier-LiqiJing/StyleVAR", "StyleVAR_SFT.pth")
    assert weights.get("stylevar_grpo").hub_file.filename == "StyleVAR-GRPO.pth"
    assert weights.get("clip").hub_file == HubFile("timm/vit_base_patch32_clip_224.openai", "open_clip_model.safetensors")
    assert all(w.downloadable for w in weights.REGISTRY.values())  # no entry without a source any more
    assert weights.get("dreamsim").tree and len(weights.get("dreamsim").parts) == 3
    with pytest.raises(KeyError, match="unknown weight 'nope'"):
        weights.get("nope")


def test_search_paths_and_resolve(weight_homes):
    sv, th = weight_homes
    assert home() == sv
    assert weights.get("vgg19").search_paths() == [th / "hub" / "checkpoints" / "vgg19-dcbb9e9d.pth",
                                                   sv / "vgg19-dcbb9e9d.pth"]
    assert weights.get("adain_decoder").search_paths() == [sv / "decoder.pth"]
    with pytest.raises(weights.MissingWeightError) as e:
        weights.resolve("vgg19")
    msg = str(e.value)
    assert "vgg19-dcbb9e9d.pth" in msg and str(th / "hub" / "checkpoints") in msg and str(sv) in msg
    assert "stylevar weights fetch vgg19" in msg
    sv.mkdir()
    (sv / "vgg19-dcbb9e9d.pth").write_bytes(b"x")  # the second search path also counts
    assert weights.resolve("vgg19") == sv / "vgg19-dcbb9e9d.pth"
    with pytest.raises(weights.MissingWeightError) as e:  # a Hub file: the HF cache, then STYLEVAR_HOME
        weights.resolve("stylevar_grpo")
    msg = str(e.value)
    assert "models--Senfier-LiqiJing--StyleVAR" in msg and "stylevar weights fetch stylevar_grpo" in msg
    assert f"place the file yourself at {sv / 'StyleVAR-GRPO.pth'}" in msg
    (sv / "StyleVAR-GRPO.pth").write_bytes(b"x")
    assert weights.resolve("stylevar_grpo") == sv / "StyleVAR-GRPO.pth"


def test_incomplete_tree_names_what_is_missing(weight_homes):
    sv, _ = weight_homes
    (sv / "dreamsim" / "dino_vitb16_single_lora").mkdir(parents=True)
    (sv / "dreamsim" / "dino_vitb16_pretrain.pth").write_bytes(b"x")
    with pytest.raises(weights.MissingWeightError) as e:
        weights.resolve("dreamsim")
    msg = str(e.value)
    assert "incomplete" in msg and "dino_vitb16_single_lora/adapter_config.json" in msg
    assert "facebookresearch_dino_main/hubconf.py" in msg and "checkpoints/dino_vitbase16_pretrain.pth" in msg


def test_state_dict_checks_list_every_bad_key(tmp_path):
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.Linear(4, 2))
    sd = {"0.weight": torch.zeros(4, 3, 3, 3), "0.bias": torch.zeros(5), "2.weight": torch.zeros(1)}
    path = tmp_path / "m.pth"
    torch.save(sd, path)
    with pytest.raises(WeightMismatchError) as e:
        load_into(model, path)
    msg = str(e.value)
    assert "missing keys (2): 1.weight, 1.bias" in msg
    assert "unexpected keys (1): 2.weight" in msg
    assert "0.bias: file (5,) vs expected (4,)" in msg
    torch.save(model.state_dict(), path)
    load_into(model, path)
    torch.save(model.state_dict(), path, _use_new_zipfile_serialization=False)  # legacy format: no mmap
    load_into(model, path)
    with pytest.raises(FileNotFoundError):
        read_state_dict(tmp_path / "absent.pth")
    (tmp_path / "junk.pth").write_bytes(b"not a pickle")
    with pytest.raises(ValueError, match="cannot read weight file"):
        read_state_dict(tmp_path / "junk.pth")
    torch.save([1, 2], tmp_path / "list.pth")
    with pytest.raises(ValueError, match="does not hold a state dict"):
        read_state_dict(tmp_path / "list.pth")


def test_fetch_file_with_checksum_atomically(weight_homes, server):
    sv, _ = weight_homes
    root, url = server
    data = b"decoder bytes" * 1000
    (root / "decoder.pth").write_bytes(data)
    good = replace(weights.get("adain_decoder"),
                   parts=(weights.Part("decoder.pth", f"{url}/decoder.pth", sha256=hashlib.sha256(data).hexdigest()),))
    result = weights.fetch_weight(good, progress=False)
    assert result.path == sv / "decoder.pth" and result.path.read_bytes() == data
    assert result.sha256 == (hashlib.sha256(data).hexdigest(),)
    assert weights.fetch_weight(good, progress=False).skipped  # already present
    bad = replace(good, parts=(replace(good.parts[0], sha256="0" * 64),))
    with pytest.raises(weights.ChecksumError, match="not the published"):
        weights.fetch_weight(bad, force=True, progress=False)
    assert (sv / "decoder.pth").read_bytes() == data  # the old file is kept
    assert [p.name for p in sv.iterdir()] == ["decoder.pth"]  # no partial file left behind


def test_fetch_through_a_mirror_checks_the_torchvision_prefix(weight_homes, server, capsys):
    sv, th = weight_homes
    root, url = server
    (root / "vgg19-dcbb9e9d.pth").write_bytes(b"not the real file")
    (root / "vgg_normalised.pth").write_bytes(b"encoder")
    assert main(["weights", "fetch", "vgg19", "adain_vgg", "--mirror", url, "--quiet"]) == 1
    out, err = capsys.readouterr()
    assert "vgg19: FAILED" in err and "does not start with dcbb9e9d" in err
    assert "adain_vgg: fetched to" in out and (sv / "vgg_normalised.pth").read_bytes() == b"encoder"
    assert not (th / "hub" / "checkpoints" / "vgg19-dcbb9e9d.pth").exists()
    assert list((th / "hub" / "checkpoints").iterdir()) == []  # the temporary file was removed
    assert main(["weights", "status"]) == 0
    status = capsys.readouterr().out
    assert "adain_vgg" in status and "present" in status and "missing" in status
    assert main(["weights", "fetch", "nope"]) == 2


def test_fetch_the_dreamsim_tree(weight_homes, server):
    sv, _ = weight_homes
    root, url = server
    _zip(root / "dreamsim_dino_vitb16_checkpoint.zip", {
        "models/dino_vitb16_pretrain.pth": b"head", "models/dino_vitb16_single_lora/adapter_config.json": b"{}",
        "models/dino_vitb16_single_lora/adapter_model.safetensors": b"lora"})  # wrapped in a folder of its own
    _zip(root / "facebookresearch_dino_main.zip", {"facebookresearch-dino-7c446df/hubconf.py": b"# hub",
                                                   "facebookresearch-dino-7c446df/vision_transformer.py": b"# vit"})
    (root / "dino_vitbase16_pretrain.pth").write_bytes(b"backbone")
    result = weights.fetch("dreamsim", mirror=url, progress=False)
    folder = sv / "dreamsim"
    assert result.path == folder == weights.resolve("dreamsim")
    assert (folder / "dino_vitb16_single_lora" / "adapter_model.safetensors").read_bytes() == b"lora"
    assert (folder / "facebookresearch_dino_main" / "hubconf.py").read_bytes() == b"# hub"
    assert (folder / "checkpoints" / "dino_vitbase16_pretrain.pth").read_bytes() == b"backbone"
    assert sorted(p.name for p in folder.iterdir()) == [
        "checkpoints", "dino_vitb16_pretrain.pth", "dino_vitb16_single_lora", "facebookresearch_dino_main"]
    (folder / "checkpoints" / "dino_vitbase16_pretrain.pth").unlink()
    again = weights.fetch("dreamsim", mirror=url, progress=False)  # only the absent part is downloaded
    assert again.sha256 == (hashlib.sha256(b"backbone").hexdigest(),) and weights.resolve("dreamsim") == folder


def test_fetch_refuses_unsafe_archives_and_absent_files(weight_homes, server, monkeypatch):
    sv, _ = weight_homes
    set_hf_env(monkeypatch, offline=True)  # never the real Hub from a test
    root, url = server
    _zip(root / "facebookresearch_dino_main.zip", {"../escape.py": b"x"})
    weight = weights.get("dreamsim")
    with pytest.raises(ValueError, match="outside the target folder"):
        weights.fetch_weight(replace(weight, parts=(weight.parts[1],)), mirror=url, progress=False)
    assert not (sv / "escape.py").exists() and not (sv.parent / "escape.py").exists()
    with pytest.raises(weights.SourceUnreachableError, match="(?s)downloads are off .*Senfier-LiqiJing/StyleVAR/"
                                                             "resolve/main/StyleVAR_SFT.pth"):
        weights.fetch("stylevar_sft", progress=False)  # the Hub, offline, and not in its cache
    with pytest.raises(OSError):  # nothing served under that name: HTTP 404
        weights.fetch("var_d16", mirror=url, progress=False)
    assert not (sv / "var_d16.pth").exists()


def test_offline_each_source_fails_at_once_with_its_file_url_and_place(weight_homes, monkeypatch, capsys):
    """No network (a source on a loopback port nothing listens on): one probe per source, with a short timeout, and
    no download started (nothing retries); the message names the file, its URL and where to put it by hand."""
    import socket
    import urllib.request

    from huggingface_hub import constants

    sv, th = weight_homes
    closed = f"http://127.0.0.1:{free_port()}"
    monkeypatch.setattr(constants, "ENDPOINT", closed)  # the Hub, for `clip`
    set_hf_env(monkeypatch, offline=False)
    for proxy in ("http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(proxy, raising=False)
    monkeypatch.setattr(urllib.request, "getproxies", dict)
    timeouts = []
    connect = socket.create_connection
    monkeypatch.setattr(socket, "create_connection", lambda address, timeout, *a, **k: (
        timeouts.append(timeout), connect(address, timeout, *a, **k))[1])

    def no_download(*args, **kwargs):
        raise AssertionError("a download started for an unreachable source")

    monkeypatch.setattr(torch.hub, "download_url_to_file", no_download)
    monkeypatch.setattr("huggingface_hub.hf_hub_download", no_download)
    assert main(["weights", "fetch", "clip", "--quiet"]) == 1  # from the Hub
    assert main(["weights", "fetch", "vgg16", "dreamsim", "--mirror", closed + "/mirror", "--quiet"]) == 1
    err = capsys.readouterr().err
    assert timeouts == [weights.hub.CONNECT_TIMEOUT_S] * 3 and weights.hub.CONNECT_TIMEOUT_S <= 2
    assert f"vgg16: FAILED: cannot download vgg16-397923af.pth: {closed} cannot be reached" in err
    assert f"  its URL: {closed}/mirror/vgg16-397923af.pth\n" in err
    assert f"put it at {th / 'hub' / 'checkpoints' / 'vgg16-397923af.pth'}; or fetch from a mirror" in err
    assert (f"clip: FAILED: cannot download open_clip_model.safetensors: the Hub ({closed}) cannot be reached: "
            f"[Errno 111] Connection refused within {weights.hub.CONNECT_TIMEOUT_S:g} s\n"
            f"  its URL: {weights.get('clip').hub_file.url}\n"  # (huggingface_hub's, from HF_ENDPOINT at its import)
            "  to fetch it by hand, download that URL where there is internet and put it at "
            f"{sv / 'open_clip' / 'ViT-B-32-openai' / 'open_clip_model.safetensors'}; or fetch from a mirror") in err
    assert (f"dreamsim: FAILED: cannot download dreamsim_dino_vitb16_checkpoint.zip: {closed} cannot "
            f"be reached") in err and f"unpack it into {sv / 'dreamsim'}; or" in err
    assert "urlopen" not in err and "Retry" not in err and not sv.exists()
