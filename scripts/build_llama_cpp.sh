#!/usr/bin/env bash
# Build llama.cpp's native binaries (the bench's `llama-cpp` peer) from the source vendored in the
# pinned llama-cpp-python sdist: llama.cpp as its users build it, without the multi-row kernels
# (patches/ggml) that install.sh adds to specpilot's own ggml.
#
#   bash scripts/build_llama_cpp.sh            # -> $SPECPILOT_CACHE/llama.cpp/<version>/bin
#   LLAMA_CPP_DEST=DIR bash scripts/build_llama_cpp.sh
#
# AMX stays off: with GGML_NATIVE, -march=native turns AMX on whatever ggml's own switches say,
# and the AMX code crashed on an AMX Xeon. No UI, no HTTPS, nothing downloaded at build time.
# Idempotent: a second run with the binaries present and the same flags does nothing.
set -euo pipefail

VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
CACHE="${SPECPILOT_CACHE:-$HOME/.cache/specpilot}"
DEST="${LLAMA_CPP_DEST:-$CACHE/llama.cpp/$VERSION}"
TARGETS=(llama-server llama-bench llama-speculative-simple llama-cli)
JOBS="${JOBS:-$(nproc)}"
PY="${PYTHON:-python3}"

NO_AMX="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
CC_BIN="${CC:-cc}"
if ! echo 'int main(void){return 0;}' | "$CC_BIN" $NO_AMX -x c -o /dev/null - 2>/dev/null; then
  NO_AMX=""  # compiler without AMX switches: it cannot emit AMX either
fi
CMAKE_FLAGS=(
  -DCMAKE_BUILD_TYPE=Release
  -DBUILD_SHARED_LIBS=OFF
  -DGGML_NATIVE=ON
  -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF
  "-DCMAKE_C_FLAGS=$NO_AMX" "-DCMAKE_CXX_FLAGS=$NO_AMX"
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=ON -DLLAMA_BUILD_TOOLS=ON
  -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF
  -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF
)
STAMP_TEXT="$VERSION ${CMAKE_FLAGS[*]} ${TARGETS[*]}"

all_built() {
  for t in "${TARGETS[@]}"; do [[ -x "$DEST/bin/$t" ]] || return 1; done
  [[ -f "$DEST/stamp" && "$(cat "$DEST/stamp")" == "$STAMP_TEXT" ]]
}
if all_built; then
  echo "llama.cpp $VERSION already built in $DEST/bin"
  exit 0
fi

command -v cmake >/dev/null || "$PY" -m pip install cmake
GENERATOR=()
if command -v ninja >/dev/null || "$PY" -m pip install ninja; then
  command -v ninja >/dev/null && GENERATOR=(-G Ninja)
fi

mkdir -p "$DEST"
SRC="$DEST/src/llama_cpp_python-$VERSION"
if [[ ! -f "$SRC/vendor/llama.cpp/CMakeLists.txt" ]]; then
  DL="$(mktemp -d)"
  trap 'rm -rf "$DL"' EXIT
  # Only this package as source: its build backend (for the metadata pip reads) comes as wheels.
  "$PY" -m pip download --no-deps --no-binary llama-cpp-python --dest "$DL" "llama-cpp-python==$VERSION"
  mkdir -p "$DEST/src"
  tar -xzf "$DL"/llama_cpp_python-"$VERSION".tar.gz -C "$DEST/src"
fi

BUILD="$DEST/build"
cmake -S "$SRC/vendor/llama.cpp" -B "$BUILD" "${GENERATOR[@]}" "${CMAKE_FLAGS[@]}"
cmake --build "$BUILD" --config Release -j "$JOBS" --target "${TARGETS[@]}"

mkdir -p "$DEST/bin"
for t in "${TARGETS[@]}"; do cp -f "$BUILD/bin/$t" "$DEST/bin/$t"; done
echo "$STAMP_TEXT" >"$DEST/stamp"
echo "llama.cpp $VERSION built in $DEST/bin: ${TARGETS[*]}"
