#!/bin/sh
# tests/check_exports.sh LIB INCLUDE_DIR — fails unless the shared library
# exports exactly the functions the public headers declare FSDP_API: a
# symbol outside them (an internal fsdp_* helper made visible, a dependency's
# symbol past src/libfsdp.map) or a declared one missing (never defined, or
# hidden), each listed.
set -eu
lib=$1
inc=$2
exported=$(nm -D --defined-only "$lib" | awk '{print $3}' | sort -u)
[ -n "$exported" ] || { echo "check_exports: $lib exports nothing (nm failed?)"; exit 1; }
# The name before the first '(' of each FSDP_API declaration (it may wrap).
declared=$(awk '/FSDP_API/ && !/#define/ {
  d = $0
  while (d !~ /\(/ && (getline l) > 0) d = d " " l
  sub(/\(.*/, "", d)
  n = split(d, w, /[^A-Za-z0-9_]+/)
  print w[n]
}' "$inc"/*.h | sort -u)
[ -n "$declared" ] || { echo "check_exports: no FSDP_API declarations in $inc"; exit 1; }
extra=$(printf '%s\n' "$exported" | grep -vxF "$declared" || true)
missing=$(printf '%s\n' "$declared" | grep -vxF "$exported" || true)
status=0
if [ -n "$extra" ]; then
  echo "check_exports: $lib exports $(printf '%s\n' "$extra" | wc -l) symbol(s) no public header declares FSDP_API:"
  printf '  %s\n' $extra
  status=1
fi
if [ -n "$missing" ]; then
  echo "check_exports: $lib does not export $(printf '%s\n' "$missing" | wc -l) declared FSDP_API function(s):"
  printf '  %s\n' $missing
  status=1
fi
[ $status -ne 0 ] || echo "check_exports: $(printf '%s\n' "$exported" | wc -l) symbols, exactly the FSDP_API declarations"
exit $status
