"""Published models through the Hugging Face Hub, fully offline: each test builds a local huggingface_hub
cache (the documented layout: models--OWNER--NAME/{blobs, refs/main, snapshots/<commit>/...}) holding
stand-in weights in the published layouts at the small reference config, and runs with HF_HUB_OFFLINE=1."""
from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import torch
from PIL import Image

from serve.testing import ServerProcess
from stylevar.loaders import hub
from stylevar.loaders import weights
from stylevar.cli import main
from stylevar.pipelines.pipeline import StylePipeline
from stylevar.loaders.pull import resolve_model
from tests.conftest import set_hf_env

REPO = "stand-in/StyleVAR-small"
WRONG_REPO = "stand-in/wrong-layout"  # its GRPO file is a class-conditional VAR checkpoint
COMMIT = hashlib.sha1(b"stand-in commit").hexdigest()
REPO_ROOT = Path(__file__).resolve().parents[2]


def add_to_hub_cache(cache: Path, repo_id: str, files: dict[str, bytes], commit: str = COMMIT) -> dict[str, Path]:
    """Lay `files` out as huggingface_hub stores a download of `repo_id` at `commit` (its `main`)."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    out = {}
    for name, data in files.items():
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()  # LFS files are stored under their sha256
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(data)
        link = repo / "snapshots" / commit / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
        out[name] = link
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text(commit)
    return out


def _pth(obj) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


@pytest.fixture(scope="module")
def published(golden):
    """The files of a stand-in StyleVAR repository: tokenizer, GRPO (plain state dict), SFT (trainer layout)
    and the repository's shape file (the small reference config)."""
    return {
        hub.VAE_FILE: _pth(golden["vae_sd"]),
        hub.VARIANTS["grpo"]: _pth(golden["stylevar_sd"]),
        hub.VARIANTS["sft"]: _pth({"trainer": {"var_wo_ddp": golden["stylevar_sd"]}, "args": {}}),
        hub.SHAPE_FILE: json.dumps(golden["cfg"]).encode(),
    }


@pytest.fixture(scope="module")
def hub_cache(published, golden, tmp_path_factory) -> tuple[Path, dict[str, Path]]:
    """One Hugging Face cache for the module (pulls only read it): REPO and WRONG_REPO at COMMIT."""
    cache = tmp_path_factory.mktemp("hf-cache")
    links = add_to_hub_cache(cache, REPO, published)
    add_to_hub_cache(cache, WRONG_REPO, {hub.VAE_FILE: published[hub.VAE_FILE],
                                         hub.VARIANTS["grpo"]: _pth(golden["var_sd"])})
    return cache, links


def _offline(monkeypatch, tmp_path: Path, hf_cache: Path) -> dict[str, str]:
    set_hf_env(monkeypatch, cache=hf_cache, offline=True)
    env = {"HF_HUB_CACHE": str(hf_cache), "HF_HUB_OFFLINE": "1", "STYLEVAR_HOME": str(tmp_path / "sv"),
           "TORCH_HOME": str(tmp_path / "th"), "HF_HUB_DISABLE_PROGRESS_BARS": "1"}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    return {**os.environ, **env, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}


@pytest.fixture
def offline_env(tmp_path, monkeypatch, hub_cache) -> dict[str, str]:
    """The module's Hugging Face cache, an empty weight cache, downloads off; also as a subprocess environment."""
    return _offline(monkeypatch, tmp_path, hub_cache[0])


@pytest.fixture
def empty_env(tmp_path, monkeypatch) -> dict[str, str]:
    """An empty Hugging Face cache (tmp_path/hf, not created) and weight cache, downloads off."""
    return _offline(monkeypatch, tmp_path, tmp_path / "hf")


def _images(folder: Path) -> tuple[Path, Path]:
    c, s = folder / "content.png", folder / "style.png"
    Image.linear_gradient("L").resize((96, 64)).convert("RGB").save(c)
    Image.radial_gradient("L").resize((80, 80)).convert("RGB").save(s)
    return c, s


def _logits(model_dir: Path, data: dict) -> torch.Tensor:
    """Teacher-forced logits of the model directory for the first golden sample."""
    pipe = StylePipeline.from_pretrained(model_dir, device="cpu")
    with torch.no_grad():
        return pipe.model.teacher_forcing_logits(data["content"][:1], data["style"][:1],
                                                 [t[:1] for t in data["target_idx"]])


def test_hub_ids_parse():
    assert hub.HubModel.parse("hf:a/b") == hub.HubModel("a/b", "grpo", "main")
    assert hub.HubModel.parse("hf:a/b:sft").checkpoint == "StyleVAR_SFT.pth"
    m = hub.HubModel.parse("hf:a/b@v1.0:sft")
    assert (m.revision, m.variant, m.id) == ("v1.0", "sft", "hf:a/b@v1.0:sft")
    for bad in ("hf:a", "hf:a/b:large", "a/b", "hf:/b"):
        with pytest.raises(ValueError):
            hub.HubModel.parse(bad)
    assert hub.is_hub_id("hf:a/b") and hub.is_hub_id(Path("hf:a/b")) and not hub.is_hub_id("models/a")
    assert resolve_model("some/dir") == Path("some/dir") and resolve_model(None) is None


@pytest.mark.slow
def test_pull_writes_what_convert_writes(offline_env, hub_cache, published, golden, reference_dir, tmp_path, capsys):
    links = hub_cache[1]
    config = reference_dir / "golden_small" / "config.json"
    pulled, converted = tmp_path / "pulled", tmp_path / "converted"
    assert main(["pull", REPO, "--variant", "grpo", "--config", str(config), "--out", str(pulled), "--quiet"]) == 0
    assert f"wrote {pulled}" in capsys.readouterr().out
    assert main(["convert", "--vae", str(links[hub.VAE_FILE]), "--model", str(links[hub.VARIANTS["grpo"]]),
                 "--config", str(config), "--out", str(converted)]) == 0
    assert torch.equal(_logits(pulled, golden["data"]), _logits(converted, golden["data"]))

    source = json.loads((pulled / "config.json").read_text())["extra"]["source"]
    assert (source["repo"], source["variant"], source["revision"], source["commit"]) == (REPO, "grpo", "main", COMMIT)
    assert source["files"] == {name: {"sha256": hashlib.sha256(published[name]).hexdigest(),
                                      "size": len(published[name])}
                               for name in (hub.VAE_FILE, hub.VARIANTS["grpo"])}
    assert COMMIT in (pulled / "README.md").read_text()

    stamp = (pulled / "transformer.safetensors").stat().st_mtime_ns
    assert main(["pull", REPO, "--config", str(config), "--out", str(pulled), "--quiet"]) == 0
    assert "nothing to do" in capsys.readouterr().out
    assert (pulled / "transformer.safetensors").stat().st_mtime_ns == stamp
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no staging folder left


@pytest.mark.slow
def test_stylize_pulls_a_hub_id_on_first_use(offline_env, tmp_path, capsys):
    content, style = _images(tmp_path)
    out = tmp_path / "out.png"
    assert main(["stylize", str(content), str(style), "-o", str(out), "--model", f"hf:{REPO}",
                 "--device", "cpu", "--top-k", "8"]) == 0
    assert Image.open(out).size[0] > 0
    model_dir = Path(offline_env["STYLEVAR_HOME"]) / "models" / REPO.replace("/", "--") / "grpo"
    source = json.loads((model_dir / "config.json").read_text())["extra"]["source"]
    assert source["shape_file"] == hub.SHAPE_FILE and source["shape"] == "default"
    # the library entry point resolves the same id to the same folder, now without converting again
    assert resolve_model(f"hf:{REPO}:grpo") == model_dir
    assert StylePipeline.from_pretrained(f"hf:{REPO}", device="cpu").config.extra["source"]["commit"] == COMMIT


@pytest.mark.slow
def test_serve_answers_with_a_hub_model(offline_env, tmp_path):
    content, style = _images(tmp_path)
    settings = {k: offline_env[k] for k in ("HF_HUB_CACHE", "HF_HUB_OFFLINE", "STYLEVAR_HOME", "TORCH_HOME")}
    with ServerProcess.serve(f"hf:{REPO}:sft", settings={**settings, "STYLEVAR_WARMUP": "false"},
                             log_dir=tmp_path) as srv:
        srv.wait_ready(timeout=180)
        files = {"content": ("c.png", content.read_bytes(), "image/png"),
                 "style": ("s.png", style.read_bytes(), "image/png")}
        r = httpx.post(srv.url + "/stylize", files=files, data={"seed": "3", "top_k": "8"}, timeout=120)
        assert r.status_code == 200, r.text
        assert Image.open(io.BytesIO(r.content)).size == (96, 64)
        info = httpx.get(srv.url + "/v1/model", timeout=10).json()
        assert "StyleVAR_SFT" in json.dumps(info)
    assert (Path(offline_env["STYLEVAR_HOME"]) / "models" / REPO.replace("/", "--") / "sft" / "config.json").is_file()


@pytest.mark.slow
def test_every_entry_point_fails_fast_offline_with_an_empty_cache(empty_env, tmp_path):
    content, style = _images(tmp_path)
    manifest = tmp_path / "manifest.jsonl"
    manifest.write_text(json.dumps({"content": "content.png", "style": "style.png", "target": "content.png",
                                    "split": "train"}) + "\n")
    absent = "nobody/absent"
    py = sys.executable
    commands = {
        "stylize": [py, "-m", "stylevar.cli", "stylize", str(content), str(style), "-o", str(tmp_path / "o.png"),
                    "--model", f"hf:{absent}"],
        "pull": [py, "-m", "stylevar.cli", "pull", absent],
        "serve": [py, "-m", "serve", "--model", f"hf:{absent}", "--port", "0", "--no-ui"],
        "evaluate": [py, "-m", "stylevar.cli", "evaluate", "--method", f"hf:{absent}", "--benchmark",
                     f"b={manifest}", "--out", str(tmp_path / "eval"), "--device", "cpu"],
        "sft": [py, "-m", "training.sft", "--data", str(manifest), "--tokenizer", f"hf:{absent}", "--init",
                f"hf:{absent}", "--out", str(tmp_path / "run"), "--max-steps", "1"],
        "grpo": [py, "-m", "training.grpo", "--data", str(manifest), "--init", f"hf:{absent}", "--out",
                 str(tmp_path / "grpo"), "--max-steps", "1"],
    }
    started = time.monotonic()
    procs = {name: subprocess.Popen(cmd, cwd=REPO_ROOT, env=empty_env, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True) for name, cmd in commands.items()}
    for name, proc in procs.items():
        _, err = proc.communicate(timeout=120)
        assert proc.returncode != 0, name
        for words in (absent, hub.VAE_FILE, hub.VARIANTS["grpo"], f"stylevar pull {absent} --variant grpo",
                      "HF_HUB_OFFLINE"):
            assert words in err, (name, words, err)
        assert "Traceback" not in err, (name, err)
    assert time.monotonic() - started < 60  # six interpreters at once on a shared machine; each alone takes ~2 s
    with pytest.raises(hub.HubError, match="stylevar pull nobody/absent --variant sft"):
        StylePipeline.from_pretrained(f"hf:{absent}:sft")
    assert not (Path(empty_env["STYLEVAR_HOME"]) / "models").exists()  # nothing was started


def _closed_port() -> int:
    """A loopback port nothing listens on (bound, then released): a connection there is refused."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def no_route_env(tmp_path, monkeypatch) -> dict[str, str]:
    """An empty cache, no HF_HUB_OFFLINE, and the Hub's endpoint on a closed loopback port (no real network)."""
    endpoint = f"http://127.0.0.1:{_closed_port()}"
    env = {k: v for k, v in os.environ.items() if k not in hub.OFFLINE_VARIABLES}
    return {**env, "HF_HUB_CACHE": str(tmp_path / "hf"), "HF_ENDPOINT": endpoint, "STYLEVAR_HOME": str(tmp_path / "sv"),
            "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}


def test_no_route_to_the_hub_without_hf_hub_offline_fails_at_once_naming_everything(no_route_env, tmp_path):
    """The probe finds the endpoint closed once; no retries; every missing file and the pull command are named,
    and nothing suggests unsetting HF_HUB_OFFLINE, which is not set."""
    absent = "nobody/absent"
    commands = {"pull": [sys.executable, "-m", "stylevar.cli", "pull", absent],
                "serve": [sys.executable, "-m", "serve", "--model", f"hf:{absent}", "--port", "0", "--no-ui"]}
    for name, cmd in commands.items():
        done = subprocess.run(cmd, cwd=REPO_ROOT, env=no_route_env, capture_output=True, text=True, timeout=120)
        assert done.returncode != 0, name
        for words in (f"repository {absent} (revision main), files: {hub.VAE_FILE}, {hub.VARIANTS['grpo']}",
                      f"the Hub ({no_route_env['HF_ENDPOINT']}) cannot be reached",
                      f"stylevar pull {absent} --variant grpo", "set HF_ENDPOINT to a mirror"):
            assert words in done.stderr, (name, words, done.stderr)
        for words in ("HF_HUB_OFFLINE", "Retry", "Traceback"):
            assert words not in done.stderr, (name, words, done.stderr)
    assert not (Path(no_route_env["STYLEVAR_HOME"]) / "models").exists()


def test_the_probe_tells_a_listening_endpoint_from_a_closed_one(monkeypatch):
    import socket

    from huggingface_hub import constants

    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        monkeypatch.setattr(constants, "ENDPOINT", f"http://127.0.0.1:{server.getsockname()[1]}")
        assert hub.unreachable() == ""
    closed = f"http://127.0.0.1:{_closed_port()}"
    monkeypatch.setattr(constants, "ENDPOINT", closed)
    assert hub.unreachable().startswith(f"the Hub ({closed}) cannot be reached: ")


@pytest.mark.slow
def test_a_wrong_layout_names_its_keys(offline_env, reference_dir, tmp_path, capsys):
    out = tmp_path / "model"
    config = reference_dir / "golden_small" / "config.json"
    assert main(["pull", WRONG_REPO, "--config", str(config), "--out", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "checkpoint does not fit StyleVAR" in err
    assert "class_emb.weight" in err and "blocks.0.attn.mat_qkv.weight" in err  # unexpected keys, named
    assert "missing keys: style_encoder.0.weight" in err  # and the missing ones
    assert not out.exists() and [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_weights_fetch_and_status_use_the_hub_cache(empty_env, capsys):
    cache = Path(empty_env["HF_HUB_CACHE"])
    clip = add_to_hub_cache(cache, "timm/vit_base_patch32_clip_224.openai",
                            {"open_clip_model.safetensors": b"stand-in clip"})["open_clip_model.safetensors"]
    assert weights.resolve("clip") == clip  # what the CLIP metric loads
    assert main(["weights", "fetch", "clip", "--quiet"]) == 0
    assert f"clip: present at {clip}" in capsys.readouterr().out
    assert main(["weights", "fetch", "clip", "--force", "--quiet"]) == 0  # through huggingface_hub, offline
    assert f"fetched to {clip} (sha256 {hashlib.sha256(b'stand-in clip').hexdigest()})" in capsys.readouterr().out
    assert main(["weights", "fetch", "var_d20", "--quiet"]) == 1
    err = capsys.readouterr().err
    assert "var_d20: FAILED" in err and "FoundationVision/var" in err and "HF_HUB_OFFLINE" in err
    assert main(["weights", "path", "clip"]) == 0 and capsys.readouterr().out.strip() == str(clip)
    assert main(["weights", "path", "var_d20"]) == 1 and "stylevar weights fetch var_d20" in capsys.readouterr().err
    assert main(["weights", "status"]) == 0
    rows = capsys.readouterr().out
    line = next(ln for ln in rows.splitlines() if ln.startswith("clip "))
    assert "present" in line and str(clip) in line
    assert next(ln for ln in rows.splitlines() if ln.startswith("var_d20 ")).split()[1] == "missing"


@pytest.mark.slow
def test_pull_help_and_its_offline_refusal_import_no_torch(empty_env):
    probe = ("import sys\nfrom stylevar.cli import main\ntry:\n    code = main(sys.argv[1:])\n"
             "except SystemExit as e:\n    code = e.code\nprint('exit', code, 'torch' in sys.modules)")
    for args, code in ((["pull", "--help"], 0), (["pull", "nobody/absent"], 2)):
        done = subprocess.run([sys.executable, "-c", probe, *args], cwd=REPO_ROOT, env=empty_env, capture_output=True,
                              text=True, timeout=60)
        assert done.stdout.strip().endswith(f"exit {code} False"), (args, done.stdout, done.stderr)
