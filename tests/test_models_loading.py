"""Loading specs: the dtype keys, a VLM wrapper, Hugging Face repo ids, and the weights hash.

Mistral-Small-3.1-24B reference: 24,011,361,280 parameters (keras-hub's preset metadata for
mistral_small_3.1_24b, and the Hub figure quoted for Mistral-Small-3.2-24B, same sizes).
"""

from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path

import pytest

from blitzplan import InvalidInputError, load_model
from blitzplan.models import ModelIdentity, weights_hash
from tests import model_configs as C

LLAMA_8B_BF16_BYTES = 16_060_522_496
LLAMA_8B = {key: value for key, value in load_model("llama-3-8b").config.items()}


# --- dtype -----------------------------------------------------------------------------------


def test_dtype_key_of_newer_transformers_is_read() -> None:
    config = {k: v for k, v in LLAMA_8B.items() if k != "torch_dtype"}
    assert load_model({**config, "dtype": "float32"}).total_bytes == 2 * LLAMA_8B_BF16_BYTES


def test_dtype_wins_over_torch_dtype_when_they_disagree() -> None:
    spec = load_model({**LLAMA_8B, "torch_dtype": "bfloat16", "dtype": "float32"})
    assert spec.dtype_bytes == 4


def test_unknown_dtype_names_the_key_it_came_from() -> None:
    with pytest.raises(InvalidInputError, match="field 'dtype' has unknown value 'float13'"):
        load_model({**LLAMA_8B, "dtype": "float13"})


# --- vision-language wrapper -----------------------------------------------------------------


def test_mistral_small_3_1_vlm_counts_text_vision_and_projector() -> None:
    spec = load_model(C.MISTRAL_SMALL_3_1)
    assert spec.total_params == 24_011_361_280
    assert spec.total_bytes == 2 * 24_011_361_280
    text = load_model("mistral-small-24b")  # the same language model
    assert spec.unit_bytes()[1:] == text.unit_bytes()[1:]
    assert spec.unit_bytes()[0] == text.unit_bytes()[0] + spec.vision_bytes
    assert spec.shard(2).unit_bytes[0] == text.shard(2).unit_bytes[0] + spec.vision_bytes


def test_other_vlm_wrappers_are_refused_pointing_at_text_config() -> None:
    llava = {**C.MISTRAL_SMALL_3_1, "model_type": "llava"}
    with pytest.raises(InvalidInputError, match=r"wrapper.*pass config\['text_config'\]"):
        load_model(llava)
    with pytest.raises(InvalidInputError, match="names no dtype"):  # it is at the top level
        load_model(llava["text_config"])
    text = load_model(llava["text_config"], dtype_bytes=2)
    assert text.total_bytes == load_model("mistral-small-24b").total_bytes


def test_vlm_missing_text_field_points_at_text_config() -> None:
    text = {k: v for k, v in C.MISTRAL_SMALL_3_1["text_config"].items() if k != "vocab_size"}
    with pytest.raises(InvalidInputError, match="field 'text_config' is missing .*vocab_size"):
        load_model({**C.MISTRAL_SMALL_3_1, "text_config": text})


def test_quantized_vlm_is_refused() -> None:
    quantized = {**C.MISTRAL_SMALL_3_1, "quantization_config": {"quant_method": "fp8"}}
    with pytest.raises(InvalidInputError, match="quantized vision-language model is not sized"):
        load_model(quantized)


# --- Hugging Face repo ids -------------------------------------------------------------------


def test_repo_id_of_a_preset_is_that_preset() -> None:
    assert load_model("meta-llama/Meta-Llama-3-8B").identity == load_model("llama-3-8b").identity


def test_repo_id_with_supplied_config(tmp_path: Path) -> None:
    spec = load_model("acme/llama-8b-ft", config=LLAMA_8B)
    assert (spec.name, spec.total_bytes) == ("acme/llama-8b-ft", LLAMA_8B_BF16_BYTES)
    (tmp_path / "config.json").write_text(json.dumps(LLAMA_8B))
    from_path = load_model("acme/llama-8b-ft", config=tmp_path / "config.json")
    assert from_path.identity == spec.identity


def test_unknown_repo_id_says_how_to_supply_a_config(tmp_path: Path) -> None:
    with pytest.raises(
        InvalidInputError, match=r"never downloads: pass config=.*models--acme--nope"
    ):
        load_model("acme/nope", cache_dir=tmp_path)


def write_safetensors(path: Path, tensors: dict[str, bytes]) -> None:
    """A minimal safetensors file: u64 header length, JSON header, raw bytes (dtype U8)."""
    header, offset = {}, 0
    for name, data in tensors.items():
        header[name] = {
            "dtype": "U8",
            "shape": [len(data)],
            "data_offsets": [offset, offset + len(data)],
        }
        offset += len(data)
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"".join(tensors.values()))


def make_checkpoint(directory: Path, payload: bytes = b"\x01\x02") -> Path:
    directory.mkdir(parents=True)
    (directory / "config.json").write_text(json.dumps(LLAMA_8B))
    write_safetensors(directory / "model-00001-of-00002.safetensors", {"a.weight": payload})
    write_safetensors(directory / "model-00002-of-00002.safetensors", {"b.weight": b"\x03"})
    weight_map = {
        "a.weight": "model-00001-of-00002.safetensors",
        "b.weight": "model-00002-of-00002.safetensors",
    }
    (directory / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    return directory


def test_hub_cache_snapshot_is_found_and_identified_by_blob_digests(tmp_path: Path) -> None:
    plain = load_model(make_checkpoint(tmp_path / "plain"))
    repo = tmp_path / "hub" / "models--acme--llama-8b-ft"
    snapshot = repo / "snapshots" / ("c" * 40)
    snapshot.mkdir(parents=True)
    (repo / "blobs").mkdir()
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("c" * 40)
    for file in (tmp_path / "plain").iterdir():
        blob = repo / "blobs" / hashlib.sha256(file.read_bytes()).hexdigest()
        blob.write_bytes(file.read_bytes())
        (snapshot / file.name).symlink_to(blob)
    cached = load_model("acme/llama-8b-ft", cache_dir=tmp_path / "hub")
    assert (cached.name, cached.revision) == ("acme/llama-8b-ft", "c" * 40)
    assert cached.identity.hash_kind == "weights"
    assert cached.identity == plain.identity  # blob names are the files' real SHA-256


def test_weights_hash_identifies_the_bytes_not_the_name(tmp_path: Path) -> None:
    one = load_model(make_checkpoint(tmp_path / "one"))
    two = load_model(make_checkpoint(tmp_path / "two"))
    other = load_model(make_checkpoint(tmp_path / "three", payload=b"\x01\x09"))
    assert one.identity.hash_kind == "weights" and one.name != two.name
    assert one.identity == two.identity
    assert one.identity != other.identity
    config_only = load_model(tmp_path / "one" / "config.json")
    assert config_only.identity.hash_kind == "config" and config_only.identity != one.identity


def test_weights_argument_accepts_index_file_or_files(tmp_path: Path) -> None:
    directory = make_checkpoint(tmp_path / "ckpt")
    by_dir = load_model(LLAMA_8B, weights=directory).identity
    by_index = load_model(LLAMA_8B, weights=directory / "model.safetensors.index.json").identity
    files = sorted(directory.glob("*.safetensors"))
    assert by_dir == by_index == load_model(LLAMA_8B, weights=files).identity
    assert by_dir.content_hash == weights_hash(files)


def test_index_listing_a_missing_shard_is_refused(tmp_path: Path) -> None:
    directory = make_checkpoint(tmp_path / "ckpt")
    (directory / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(InvalidInputError, match=r"lists 1 file\(s\) that are not there"):
        load_model(directory)


def test_a_file_that_is_not_safetensors_is_refused(tmp_path: Path) -> None:
    bogus = tmp_path / "model.safetensors"
    bogus.write_bytes(b"not a safetensors file at all")
    with pytest.raises(InvalidInputError, match="is not a safetensors file"):
        load_model(LLAMA_8B, weights=bogus)


def test_identity_equality_ignores_names_only_through_the_hash() -> None:
    assert ModelIdentity("a", "main", "h", "weights") == ModelIdentity("b", "v2", "h", "weights")
    assert ModelIdentity("a", "main", "h", "weights") != ModelIdentity("a", "main", "h", "config")
    with pytest.raises(InvalidInputError, match="hash_kind must be one of"):
        ModelIdentity("a", "main", "h", "bytes")
