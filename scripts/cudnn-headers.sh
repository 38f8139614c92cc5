#!/usr/bin/env bash
# scripts/cudnn-headers.sh — finds (downloading once, from PyPI) the headers
# cuDNN attention (src/backend/cuda/attention_cudnn.cpp) compiles against and prints
# their two include directories, one per line: the cuDNN frontend's
# (header-only C++, pinned below) and cudnn.h's. src/backend/cuda/meson.build runs it
# when the CUDA build is on; on failure it exits 1 with the reason on stderr
# and the build leaves cuDNN attention out (the in-house kernel runs).
# Usage: scripts/cudnn-headers.sh CUDA_INCLUDE_DIR
#   frontend: $FSDP_CUDNN_FRONTEND_INCLUDE, else the nvidia-cudnn-frontend
#             wheel's include/ (pip download, no GitHub), unpacked once into
#             the cache;
#   cudnn.h:  $FSDP_CUDNN_INCLUDE, else CUDA_INCLUDE_DIR when it has cudnn.h,
#             else the nvidia-cudnn-cu13 wheel's headers, cached the same way.
# Cache: $FSDP_CACHE_DIR, else ${XDG_CACHE_HOME:-$HOME/.cache}/fsdp. Nothing
# downloaded belongs in the repository.
set -euo pipefail

FRONTEND_VERSION=1.32.0   # cudnn_frontend 1.32.0 (needs cuDNN 9 at run time)
CUDNN_WHEEL_VERSION=9.19.0.56 # nvidia-cudnn-cu13: cudnn.h only, where the toolkit has none

cuda_include=${1:-/usr/local/cuda/include}
cache=${FSDP_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/fsdp}

die() { echo "cudnn-headers: $*" >&2; exit 1; }

# fetch PACKAGE VERSION HEADER DEST: downloads the pinned wheel (any Python,
# this machine's architecture: the headers are the same in every wheel) and
# copies the directory holding HEADER, and everything under it, into DEST.
fetch() {
  local package=$1 version=$2 header=$3 dest=$4 tmp
  command -v python3 >/dev/null || die "no python3 to run pip for $package==$version"
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' RETURN
  local arch platforms=()
  arch=$(uname -m)
  for p in manylinux_2_28 manylinux_2_27 manylinux_2_17 manylinux2014; do
    platforms+=(--platform "${p}_$arch")
  done
  python3 -m pip download --quiet --no-deps --only-binary=:all: "${platforms[@]}" \
      --python-version 3.11 -d "$tmp" "$package==$version" >&2 ||
    die "pip download $package==$version failed (PyPI unreachable? set FSDP_CUDNN_FRONTEND_INCLUDE / FSDP_CUDNN_INCLUDE instead)"
  local wheel
  wheel=$(ls "$tmp"/*.whl 2>/dev/null | head -n 1)
  [ -n "$wheel" ] || die "pip download $package==$version gave no wheel"
  python3 - "$wheel" "$header" "$tmp/out" <<'EOF' || die "cannot unpack $header from $wheel"
import os, sys, zipfile
wheel, header, out = sys.argv[1:]
with zipfile.ZipFile(wheel) as z:
    names = z.namelist()
    hits = [n for n in names if n == header or n.endswith('/' + header)]
    if not hits:
        sys.exit('no %s in %s' % (header, wheel))
    prefix = hits[0][:len(hits[0]) - len(header)]
    for n in names:
        if n.startswith(prefix) and not n.endswith('/') and n.endswith(('.h', '.hpp')):
            target = os.path.join(out, n[len(prefix):])
            os.makedirs(os.path.dirname(target), exist_ok=True)
            with z.open(n) as src, open(target, 'wb') as dst:
                dst.write(src.read())
EOF
  mkdir -p "$(dirname "$dest")"
  rm -rf "$dest.tmp.$$"
  mv "$tmp/out" "$dest.tmp.$$"
  mv -T "$dest.tmp.$$" "$dest" 2>/dev/null || rm -rf "$dest.tmp.$$" # another configure won
}

if [ -n "${FSDP_CUDNN_FRONTEND_INCLUDE:-}" ]; then
  frontend=$FSDP_CUDNN_FRONTEND_INCLUDE
else
  frontend=$cache/cudnn-frontend-$FRONTEND_VERSION/include
  [ -f "$frontend/cudnn_frontend.h" ] ||
    fetch nvidia-cudnn-frontend "$FRONTEND_VERSION" cudnn_frontend.h "$frontend"
fi
[ -f "$frontend/cudnn_frontend.h" ] || die "no cudnn_frontend.h in $frontend"
grep -q "CUDNN_FRONTEND_MINOR_VERSION 32" "$frontend/cudnn_frontend_version.h" ||
  die "$frontend is not cuDNN frontend $FRONTEND_VERSION (src/backend/cuda/attention_cudnn.cpp is written for it)"

if [ -n "${FSDP_CUDNN_INCLUDE:-}" ]; then
  cudnn=$FSDP_CUDNN_INCLUDE
elif [ -f "$cuda_include/cudnn.h" ]; then
  cudnn=$cuda_include
else
  cudnn=$cache/cudnn-$CUDNN_WHEEL_VERSION/include
  [ -f "$cudnn/cudnn.h" ] || fetch nvidia-cudnn-cu13 "$CUDNN_WHEEL_VERSION" cudnn.h "$cudnn"
fi
[ -f "$cudnn/cudnn.h" ] || die "no cudnn.h in $cudnn"
grep -qE "define CUDNN_MAJOR 9" "$cudnn/cudnn_version.h" || die "$cudnn/cudnn.h is not cuDNN 9"

echo "$frontend"
echo "$cudnn"
