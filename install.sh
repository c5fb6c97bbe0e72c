#!/usr/bin/env bash
# Install specpilot into the current Python environment: `bash install.sh` (users) or
# `bash install.sh dev` (with the test and lint extras).
#
# llama-cpp-python (the ggml backend) has no wheel for most CPUs and is compiled here from
# source, once. AMX stays off: on AMX Xeons the default build crashed in its AMX code, and
# GGML_NATIVE's -march=native turns AMX on whatever ggml's own switches say, so the compiler is
# told -mno-amx-* too where it knows them. The wheel is built for this CPU, so pip must not
# cache it (--no-cache-dir) and reuse it on another. Its ggml gets specpilot's multi-row K-quant
# kernels (patches/ggml: verifying n drafted tokens unpacks each weight block once, not n
# times). Run again, it skips the build when that llama_cpp is already importable.
set -euo pipefail
cd "$(dirname "$0")"
root=$PWD

PYTHON="${PYTHON:-python3}"
TORCH_VERSION="2.13.0"
LLAMA_CPP_VERSION="0.3.36"

case "${1:-}" in
    "") target="." ;;
    dev) target=".[dev]" ;;
    *) echo "usage: bash install.sh [dev]" >&2; exit 2 ;;
esac

pip_install() { "$PYTHON" -m pip install --quiet --disable-pip-version-check "$@"; }

pip_install "torch==${TORCH_VERSION}"

# The installed llama_cpp's version, with "+multirow" when its ggml has the patched kernels.
installed=$("$PYTHON" - <<'PY' 2>/dev/null || true
import ctypes, glob, os, llama_cpp
libs = glob.glob(os.path.join(os.path.dirname(llama_cpp.__file__), "lib", "libggml-cpu*"))
patched = any(hasattr(ctypes.CDLL(lib), "ggml_multirow_dot") for lib in libs)
print(llama_cpp.__version__ + ("+multirow" if patched else ""))
PY
)
if [ "$installed" != "${LLAMA_CPP_VERSION}+multirow" ]; then
    # Compiler flags that turn AMX off, kept only if the C compiler accepts them.
    no_amx="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
    if ! echo 'int main(void){return 0;}' | "${CC:-cc}" $no_amx -x c - -o /dev/null 2>/dev/null
    then
        no_amx=""
    fi
    echo "building llama-cpp-python ${LLAMA_CPP_VERSION} for this CPU (minutes) ..." >&2
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
    "$PYTHON" -m pip download --quiet --disable-pip-version-check --no-deps --no-binary :all: \
        --dest "$work" "llama-cpp-python==${LLAMA_CPP_VERSION}"
    tar -xzf "$work"/llama_cpp_python-*.tar.gz -C "$work"
    source_dir="$work/llama_cpp_python-${LLAMA_CPP_VERSION}"
    cp patches/ggml/multirow.c patches/ggml/multirow.h "$source_dir/vendor/llama.cpp/ggml/src/ggml-cpu/"
    (cd "$source_dir/vendor/llama.cpp" && git apply "$root/patches/ggml/ggml-cpu.patch")
    "$PYTHON" -m pip uninstall --quiet --yes llama-cpp-python 2>/dev/null || true
    CMAKE_ARGS="-DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF -DLLAVA_BUILD=OFF" \
        CFLAGS="${CFLAGS:-} $no_amx" CXXFLAGS="${CXXFLAGS:-} $no_amx" \
        FORCE_CMAKE=1 \
        pip_install --no-cache-dir "$source_dir"
fi

pip_install -e "$target"
