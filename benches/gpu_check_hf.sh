#!/usr/bin/env bash
# The hf engine, the Triton scoring kernel and spcli plan's numbers on one CUDA GPU, sized for the H200 that the
# device tool lends, in one call of under 8 minutes (issue 32; steps and fields: benches/gpu_check_hf.py and
# docs/gpu-check.md). Runs with that machine's own python3 (torch 2.11 cu130, transformers 5.17, triton 3.6) plus
# what its image lacks, carried in wheels/ (ignored by git, about 4.5 MB): orjson, blingfire (selection's sentence
# units) and typer 0.29.2 with what it needs, installed into a temporary folder, never into that Python. spcli
# itself is used from this checkout. Nothing is downloaded: every model is random weights built from a config.
#
#   benches/gpu_check_hf.sh            full scale (CUDA): summary.txt, gpu_check_hf.json, log.txt, pytest.txt,
#                                      profile.txt under $OUT (default out/gpu_check_hf)
#   benches/gpu_check_hf.sh --tiny     the same steps at tiny shapes on the CPU (GPU_CHECK_SCALE=tiny does too)
#
# wheels/, made once on a machine that reaches PyPI. blingfire's wheel is 42 MB (models for other tokenizers,
# Windows and macOS libraries); only its __init__.py and Linux library travel, as a plain package in wheels/site:
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d wheels \
#     orjson==3.13.0 typer==0.29.2 pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 \
#     typing-inspection==0.4.5 typing-extensions==4.16.0 annotated-doc==0.0.7 shellingham==1.5.4
#   python3 -m pip download --no-deps -d /tmp/blingfire blingfire==0.1.8 && mkdir -p wheels/site && unzip -o \
#     /tmp/blingfire/blingfire-0.1.8-py3-none-any.whl blingfire/__init__.py blingfire/libblingfiretokdll.so -d wheels/site
# The device call: run with carry ["wheels"], timeout_s 540, command `bash benches/gpu_check_hf.sh` (its own
# deadline is 470 s; the tree and wheels/ must stay under 64 MiB together).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-out/gpu_check_hf}"
PY="${PYTHON:-python3}"
SCALE="${GPU_CHECK_SCALE:-full}"
[ "${1:-}" = "--tiny" ] && SCALE=tiny
WHEELS="${WHEELS:-wheels}"
mkdir -p "$OUT"
if compgen -G "$WHEELS/*.whl" >/dev/null; then
  SITE="$(mktemp -d)"
  trap 'rm -rf "$SITE"' EXIT
  if "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" "$WHEELS"/*.whl; then
    export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
  else  # e.g. cp312 wheels and another Python: its own packages must do
    echo "warning: $WHEELS/*.whl did not install for $PY; going on with its own packages" >&2
  fi
fi
[ -d "$WHEELS/site" ] && export PYTHONPATH="$PWD/$WHEELS/site${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
"$PY" benches/gpu_check_hf.py --scale "$SCALE" --out "$OUT"
