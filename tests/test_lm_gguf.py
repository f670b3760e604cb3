"""The GGUF cache: a tiny Llama GGUF (Q8_0 weights) written in the test loads, is cached as a Hugging Face
directory keyed by its SHA-256, reloads from the cache equal to the first load, is rebuilt when damaged, and
saves with ``save_pretrained``. Model directories never run code: ``auto_map`` and pickled weights are refused."""

import hashlib
import json

import pytest
import torch

from kdcollapse import lm
from kdcollapse.errors import KdcollapseError
from kdcollapse.lm import _gguf

transformers = pytest.importorskip("transformers", reason="pip install 'kdcollapse[llm]'")
pytest.importorskip("gguf")
from tiny_gguf import write_tiny_gguf  # noqa: E402
from tiny_lm import TEXT, llama_config, tiny_tokenizer  # noqa: E402


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(the source HF model, its tokenizer, a Q8_0 GGUF of it, a float32 GGUF of it)."""
    tokenizer = tiny_tokenizer()
    source = lm.load_language_model(llama_config(len(tokenizer), hidden=64, layers=2), tokenizer=tokenizer, seed=0)
    root = tmp_path_factory.mktemp("gguf")
    q8 = write_tiny_gguf(root / "tiny-q8.gguf", source.model, tokenizer)
    f32 = write_tiny_gguf(root / "tiny-f32.gguf", source.model, tokenizer, quantize=False)
    return source, tokenizer, q8, f32


def _ids(tokenizer):
    return torch.tensor([tokenizer.encode(TEXT[0] + " " + TEXT[3])])


@torch.no_grad()
def _logits(model, ids):
    return model(ids).logits


class _Loads:
    """Counts the loads that dequantise a GGUF file (``from_pretrained`` given ``gguf_file=``)."""

    def __init__(self, monkeypatch):
        self.gguf = 0
        original = transformers.AutoModelForCausalLM.from_pretrained.__func__

        def counted(cls, *args, **kwargs):
            self.gguf += "gguf_file" in kwargs
            return original(cls, *args, **kwargs)

        monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", classmethod(counted))


def test_the_tiny_gguf_is_the_source_model(tiny):
    """The fixture is right: the float32 GGUF loads back to the source model exactly, the Q8_0 one within Q8_0's
    rounding (one scale per 32 weights)."""
    source, tokenizer, q8, f32 = tiny
    ids = _ids(tokenizer)
    exact = lm.load_language_model(f32, cache=False)
    assert exact.tokenizer.encode(TEXT[0]) == tokenizer.encode(TEXT[0])
    torch.testing.assert_close(_logits(exact.model, ids), _logits(source.model, ids), rtol=0, atol=0)
    rounded = lm.load_language_model(q8, cache=False)
    gap = (_logits(rounded.model, ids) - _logits(source.model, ids)).abs().max()
    assert 0 < gap < 0.05


def test_a_gguf_is_cached_by_its_sha256_and_reloads_equal(tiny, tmp_path, monkeypatch):
    _, tokenizer, q8, _ = tiny
    loads = _Loads(monkeypatch)
    first = lm.load_language_model(q8, cache_dir=tmp_path)
    assert loads.gguf == 1
    sha = hashlib.sha256(q8.read_bytes()).hexdigest()
    directory = tmp_path / f"gguf-{sha[:16]}"
    manifest = json.loads((directory / _gguf.MANIFEST).read_text())
    assert manifest["gguf_sha256"] == sha and "model.safetensors" in manifest["files"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [directory.name]  # nothing temporary left
    second = lm.load_language_model(q8, cache_dir=tmp_path)
    assert loads.gguf == 1  # read from the cache, not dequantised again
    assert second.model.get_output_embeddings().weight is second.model.get_input_embeddings().weight  # still tied
    for (name, p), (_, q) in zip(first.model.named_parameters(), second.model.named_parameters(), strict=True):
        assert torch.equal(p, q), name
    ids = _ids(tokenizer)
    torch.testing.assert_close(_logits(second.model, ids), _logits(first.model, ids), rtol=0, atol=0)
    assert second.tokenizer.get_vocab() == first.tokenizer.get_vocab()
    assert second.tokenizer.encode(TEXT[2]) == first.tokenizer.encode(TEXT[2])
    assert second.tokenizer.eos_token_id == first.tokenizer.eos_token_id == tokenizer.eos_token_id
    # the tokenizer alone comes from the cache's tokenizer files too
    assert lm.load_tokenizer(q8, cache_dir=tmp_path).get_vocab() == first.tokenizer.get_vocab()
    # cache=False neither reads nor writes it
    other = tmp_path / "other"
    lm.load_language_model(q8, cache_dir=other, cache=False)
    assert loads.gguf == 2 and not any(other.glob("gguf-*"))


@pytest.mark.parametrize("damage", ["flip a weight byte", "truncate the weights", "drop the manifest",
                                    "manifest of another gguf"])
def test_a_damaged_cache_is_detected_and_rebuilt(tiny, tmp_path, monkeypatch, damage):
    _, tokenizer, q8, _ = tiny
    first = lm.load_language_model(q8, cache_dir=tmp_path)
    directory = next(tmp_path.glob("gguf-*"))
    weights, manifest = directory / "model.safetensors", directory / _gguf.MANIFEST
    data = bytearray(weights.read_bytes())
    if damage == "flip a weight byte":
        data[-5] ^= 0xFF
        weights.write_bytes(bytes(data))
    elif damage == "truncate the weights":
        weights.write_bytes(bytes(data[: len(data) // 2]))
    elif damage == "drop the manifest":
        manifest.unlink()
    else:
        manifest.write_text(manifest.read_text().replace(json.loads(manifest.read_text())["gguf_sha256"], "0" * 64))
    loads = _Loads(monkeypatch)
    again = lm.load_language_model(q8, cache_dir=tmp_path)
    assert loads.gguf == 1  # rebuilt from the GGUF
    ids = _ids(tokenizer)
    torch.testing.assert_close(_logits(again.model, ids), _logits(first.model, ids), rtol=0, atol=0)
    assert _gguf.read_gguf_cache(directory, hashlib.sha256(q8.read_bytes()).hexdigest())
    assert sorted(p.name for p in tmp_path.iterdir()) == [directory.name]
    third = lm.load_language_model(q8, cache_dir=tmp_path)
    assert loads.gguf == 1
    torch.testing.assert_close(_logits(third.model, ids), _logits(first.model, ids), rtol=0, atol=0)


def test_a_loaded_gguf_saves_as_a_hugging_face_directory(tiny, tmp_path):
    _, tokenizer, q8, _ = tiny
    model = lm.load_language_model(q8, cache=False)
    model.model.save_pretrained(tmp_path / "hf")
    model.tokenizer.save_pretrained(tmp_path / "hf")
    assert not (tmp_path / "hf" / "pytorch_model.bin").exists()
    again = lm.load_language_model(tmp_path / "hf")
    ids = _ids(tokenizer)
    torch.testing.assert_close(_logits(again.model, ids), _logits(model.model, ids), rtol=0, atol=0)
    assert "quantization_config" not in json.loads((tmp_path / "hf" / "config.json").read_text())


def test_a_model_directory_never_runs_code_or_unpickles(tiny, tmp_path):
    source, tokenizer, _, _ = tiny
    source.model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    lm.load_language_model(tmp_path)  # fine as saved
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "auto_map": {"AutoModelForCausalLM": "evil.Model"}}))
    with pytest.raises(KdcollapseError, match="names custom code .auto_map"):
        lm.load_language_model(tmp_path)
    with pytest.raises(KdcollapseError, match="names custom code"):
        lm.load_language_model(tmp_path, pretrained=False)
    (tmp_path / "config.json").write_text(json.dumps(config))
    tk = json.loads((tmp_path / "tokenizer_config.json").read_text())
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({**tk, "auto_map": {"AutoTokenizer": ["x.T", None]}}))
    with pytest.raises(KdcollapseError, match="tokenizer_config.json names custom code"):
        lm.load_tokenizer(tmp_path)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(tk))
    torch.save(source.model.state_dict(), tmp_path / "pytorch_model.bin")
    (tmp_path / "model.safetensors").unlink()
    with pytest.raises(KdcollapseError, match="no .safetensors weights"):
        lm.load_language_model(tmp_path)
