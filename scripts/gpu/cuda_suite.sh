#!/usr/bin/env bash
# The lossless, unit, CLI and training suites with every tiny test model on the GPU
# (tests/fixtures/tiny.py), for a lent GPU machine that has PyTorch but no internet: WHEELS=DIR installs the packages it lacks from
# wheels carried in DIR first (e.g. made here with `pip download --no-deps --only-binary=:all:
# --python-version 3.12 --platform manylinux2014_x86_64 -d DIR "transformers==5.24.0" gguf ...`;
# the serve tests need the closure of `pip download ... openai==3.57.0 fastapi==0.165.0
# uvicorn==0.54.0` as well: httpx2, httpcore2, truststore, sniffio, opentelemetry_api, ...).
# Arguments replace the default test paths (tests/lossless tests/unit tests/cli tests/training),
# e.g. one file to rerun.
# ../shared/data does not travel, so the tests that read it skip there.
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-.}
if [ -n "${WHEELS:-}" ]; then
  python3 -m pip install -q --no-deps --no-index "$WHEELS"/*.whl
  python3 -m pip install -q --no-deps --no-build-isolation -e .
fi
TESTS=("$@")
[ $# -eq 0 ] && TESTS=(tests/lossless tests/unit tests/cli tests/training)
python3 -c "import torch, transformers; print(torch.__version__, transformers.__version__, torch.cuda.get_device_name(0))"
SPECPILOT_TEST_DEVICE=cuda timeout "${LIMIT:-540}" python3 -m pytest -q -p no:cacheprovider \
  -n "${WORKERS:-16}" -rs --durations=20 -m "not slow" "${TESTS[@]}" \
  > "$OUT/pytest_cuda.txt" 2>&1
echo "pytest exit $?"
grep -v -i warn "$OUT/pytest_cuda.txt" | tail -40
