"""The library's single places: state-dict reading, the model-directory check, the generation settings and
dtype names."""
from __future__ import annotations

import inspect

import pytest
import torch
from safetensors.torch import save_file

from stylevar.loaders.convert import read_state
from stylevar.utils.precision import parse_dtype, resolve_autocast_dtype
from stylevar.config import DEFAULT_GENERATION, GenerationConfig
from stylevar.loaders.model_dir import MODEL_FILES, ModelDirError, PipelineConfig, check_model_dir
from stylevar.pipelines.pipeline import StylePipeline
from stylevar.models.pretrained import load_safetensors
from stylevar.models.state_dict import CheckpointError, WeightMismatchError, check_state_dict, read_checked, read_state_dict
from stylevar.models.transformer import StyleVAR
from stylevar.models.transformer.naive import naive_generate


def test_one_reader_for_pth_and_safetensors(tmp_path):
    sd = {"a": torch.ones(2, dtype=torch.float16), "n": torch.arange(3)}
    torch.save({"model": sd}, tmp_path / "c.pth")
    save_file(sd, str(tmp_path / "w.safetensors"))
    assert read_state_dict(tmp_path / "c.pth", key="model").keys() == sd.keys()
    assert read_state(tmp_path / "c.pth")[0].keys() == sd.keys()
    got = load_safetensors(tmp_path / "w.safetensors")
    assert got["a"].dtype == torch.float32 and got["n"].dtype == torch.int64
    (tmp_path / "junk.safetensors").write_bytes(b"not safetensors")
    with pytest.raises(CheckpointError, match="cannot read weight file .*junk.safetensors"):
        read_state_dict(tmp_path / "junk.safetensors")
    with pytest.raises(CheckpointError, match="cannot read checkpoint .*junk.safetensors"):
        read_state(tmp_path / "junk.safetensors")
    with pytest.raises(FileNotFoundError, match="weights file not found"):
        load_safetensors(tmp_path / "absent.safetensors")
    with pytest.raises(WeightMismatchError, match="missing keys \\(1\\): model"):
        read_state_dict(tmp_path / "w.safetensors", key="model")


def test_one_checker(tmp_path):
    expected = {"a": torch.zeros(2), "b": (3, 4)}
    check_state_dict({"a": torch.ones(2), "b": torch.ones(3, 4)}, expected, source="x")
    with pytest.raises(WeightMismatchError) as e:
        check_state_dict({"a": torch.ones(5), "c": torch.ones(1)}, expected, source="x")
    assert (e.value.missing, e.value.unexpected) == (["b"], ["c"])
    assert e.value.wrong_shape == ["a: file (5,) vs expected (2,)"]
    check_state_dict({"a": torch.ones(2), "b": torch.ones(3, 4), "c": torch.ones(1)}, expected, source="x",
                     allow_unexpected=True)
    torch.save({"a": torch.ones(2), "b": torch.ones(3, 4)}, tmp_path / "ok.pth")
    assert read_checked(tmp_path / "ok.pth", expected).keys() == {"a", "b"}


def test_model_dir_check_returns_the_config(tmp_path):
    pipe = StylePipeline.random("tiny", name="unit")
    pipe.save_pretrained(tmp_path / "m")
    config = check_model_dir(tmp_path / "m")
    assert isinstance(config, PipelineConfig) and config.name == "unit"
    (tmp_path / "m" / MODEL_FILES[2]).unlink()
    with pytest.raises(ModelDirError, match=f"missing {MODEL_FILES[2]}"):
        check_model_dir(str(tmp_path / "m"))


def test_generation_defaults_are_defined_once():
    assert (DEFAULT_GENERATION.top_k, DEFAULT_GENERATION.top_p) == (900, 0.96)
    params = inspect.signature(naive_generate).parameters
    assert (params["top_k"].default, params["top_p"].default) == (DEFAULT_GENERATION.top_k, DEFAULT_GENERATION.top_p)
    # generate takes one GenerationConfig (None: its defaults); no default of its own to drift
    assert inspect.signature(StyleVAR.generate).parameters["config"].default is None
    pipe = StylePipeline.random("tiny")
    pipe.config.generation = {"top_k": 64, "top_p": 0.9}
    assert pipe.generation_config() == GenerationConfig(top_k=64, top_p=0.9)
    assert pipe.generation_config(top_k=5, top_p=None, guidance=1.0) == GenerationConfig(5, 0.9, guidance=1.0)
    with pytest.raises(TypeError):
        GenerationConfig.from_kwargs({"top_q": 1})


def test_dtype_names():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert parse_dtype("bf16") is parse_dtype("bfloat16") is torch.bfloat16
    assert parse_dtype("fp16") is torch.float16 and parse_dtype("float32") is torch.float32
    with pytest.raises(ValueError, match="unknown dtype"):
        parse_dtype("int8")
    assert resolve_autocast_dtype("auto", cpu) is None
    assert resolve_autocast_dtype("float32", cuda) is None and resolve_autocast_dtype(torch.float32, cuda) is None
    assert resolve_autocast_dtype(None, cuda) is None
    assert resolve_autocast_dtype("fp16", cuda) is torch.float16
    assert resolve_autocast_dtype(torch.bfloat16, cpu) is torch.bfloat16
