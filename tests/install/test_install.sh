#!/usr/bin/env bash
# tests/install/test_install.sh BUILD_DIR SOURCE_DIR — the library as a user
# gets it: `meson install` staged into a temporary directory, the README's
# trainer.c and its `cc ... $(pkg-config --cflags --libs fsdp)` line taken
# from README.md as printed, compiled against the staged install (pkg-config
# finds it through PKG_CONFIG_PATH and PKG_CONFIG_SYSROOT_DIR), run at 1 rank
# and, where mpirun exists, at 2; the loss must fall and both runs agree.
set -euo pipefail
build=$(cd "$1" && pwd) src=$(cd "$2" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

meson install -C "$build" --no-rebuild --quiet --destdir "$tmp/stage" >"$tmp/install.log" 2>&1 ||
  { cat "$tmp/install.log"; echo "FAIL: meson install"; exit 1; }
pc=$(find "$tmp/stage" -name fsdp.pc | head -1)
lib=$(find "$tmp/stage" -name 'libfsdp.so' | head -1)
for f in "$pc" "$lib" "$(find "$tmp/stage" -path '*include/fsdp/fsdp.h')" \
         "$(find "$tmp/stage" -path '*bin/fsdp-train')"; do
  [ -n "$f" ] && [ -e "$f" ] || { echo "FAIL: the install lacks a file (pc '$pc', lib '$lib')"; exit 1; }
done
for h in "$src"/include/fsdp/*.h; do # every public header, since fsdp.h includes them all
  [ -n "$(find "$tmp/stage" -path "*include/fsdp/$(basename "$h")")" ] ||
    { echo "FAIL: include/fsdp/$(basename "$h") is not installed (install_headers in meson.build)"; exit 1; }
done
for t in fsdp-train fsdp-ckpt fsdp-run fsdp-eval fsdp-tokenize; do
  [ -n "$(find "$tmp/stage" -path "*bin/$t")" ] || { echo "FAIL: $t is not installed"; exit 1; }
done
echo "installed: $(find "$tmp/stage" -type f | wc -l) files, ${pc#$tmp/stage}"

# The README's section: its first ```c block and the cc line of its ```sh block.
awk '/^## Embedding the engine in a C trainer/{s=1} s&&/^```c$/{c=1;next} c&&/^```$/{exit} c' \
  "$src/README.md" >"$tmp/trainer.c"
cc_line=$(awk '/^## Embedding the engine in a C trainer/{s=1} s&&/^cc trainer.c /{print;exit}' \
  "$src/README.md")
[ -s "$tmp/trainer.c" ] && [ -n "$cc_line" ] ||
  { echo "FAIL: README.md has no trainer.c block or cc line under 'Embedding the engine'"; exit 1; }
echo "README: trainer.c $(wc -l <"$tmp/trainer.c") lines; $cc_line"

export PKG_CONFIG_PATH=$(dirname "$pc") PKG_CONFIG_SYSROOT_DIR="$tmp/stage"
export LD_LIBRARY_PATH=$(dirname "$lib") OPENBLAS_NUM_THREADS=1
(cd "$tmp" && eval "$cc_line") || { echo "FAIL: the README's cc line does not compile"; exit 1; }
ldd "$tmp/trainer" | grep "$tmp/stage.*libfsdp" >/dev/null ||
  { echo "FAIL: trainer does not link the installed libfsdp"; ldd "$tmp/trainer"; exit 1; }
(cd "$tmp" && ./trainer) >"$tmp/np1.txt" || { cat "$tmp/np1.txt"; echo "FAIL: ./trainer"; exit 1; }
cat "$tmp/np1.txt"
first=$(awk 'NR==1{print $4}' "$tmp/np1.txt") last=$(awk 'END{print $4}' "$tmp/np1.txt")
awk -v a="$first" -v b="$last" 'BEGIN{exit !(b < a / 100)}' ||
  { echo "FAIL: loss $first -> $last did not fall 100x"; exit 1; }
if command -v mpirun >/dev/null; then
  root=() ; [ "$(id -u)" -ne 0 ] || root=(--allow-run-as-root)
  (cd "$tmp" && mpirun "${root[@]}" --oversubscribe -np 2 ./trainer) >"$tmp/np2.txt" ||
    { cat "$tmp/np2.txt"; echo "FAIL: mpirun -np 2 ./trainer"; exit 1; }
  cmp -s "$tmp/np1.txt" "$tmp/np2.txt" ||
    { diff "$tmp/np1.txt" "$tmp/np2.txt"; echo "FAIL: 2 ranks differ from 1 on the same data"; exit 1; }
  echo "2 ranks: the same losses"
fi
echo "ok: installed, compiled as the README says, ran"
