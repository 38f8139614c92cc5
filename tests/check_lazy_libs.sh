#!/bin/sh
# tests/check_lazy_libs.sh LIB — fails if the shared library links (has a
# DT_NEEDED on) cuBLAS or cuDNN: both are opened at first use with dlopen
# (src/backend/cuda/cublas_lazy.h, src/backend/cuda/attention_cudnn.cpp), so that programs
# that never touch a GPU do not map them and a machine without cuDNN still
# runs everything (the in-house attention kernel then).
set -eu
lib=$1
needed=$(readelf -d "$lib" | awk '/\(NEEDED\)/ {print $NF}' | tr -d '[]')
[ -n "$needed" ] || { echo "check_lazy_libs: no DT_NEEDED in $lib (readelf failed?)"; exit 1; }
linked=$(printf '%s\n' "$needed" | grep -E '^lib(cudnn|cublas)' || true)
if [ -n "$linked" ]; then
  echo "check_lazy_libs: $lib links $linked; these must be opened with dlopen, not linked"
  exit 1
fi
echo "check_lazy_libs: $lib needs $(printf '%s ' $needed)(no cuDNN, no cuBLAS)"
