#!/usr/bin/env bash
# Copy a data set into RAM by hand, check the copy, and print the override that trains from it.
#
#   scripts/stage_tmpfs.sh SRC [DST] [SIZE]
#
# SRC is a JPEG tree (train/ and val/) or a folder written by `python -m <package>.pack`.
# As root with SIZE (say 200G), DST (default /mnt/tmpfs-<name>) becomes a tmpfs of that size;
# otherwise DST defaults to /dev/shm/<name>, which is RAM-backed already.
# Safe to run again: rsync copies only what changed, and the checks run every time.
set -euo pipefail

die() { echo "stage_tmpfs: $*" >&2; exit 1; }

[ $# -ge 1 ] && [ $# -le 3 ] || die "usage: $0 SRC [DST] [SIZE]"
src=$(realpath -e "$1" 2>/dev/null) || die "$1 does not exist"
[ -d "$src" ] || die "$src is not a folder"
name=$(basename "$src")
size=${3:-}
if [ -n "$size" ] && [ "$(id -u)" -eq 0 ]; then
    dst=${2:-/mnt/tmpfs-$name}
    mkdir -p "$dst"
    if ! mountpoint -q "$dst"; then
        mount -t tmpfs -o "size=$size" tmpfs "$dst"
        echo "mounted a tmpfs of $size on $dst"
    fi
else
    dst=${2:-/dev/shm/$name}
    [ -z "$size" ] || echo "not root: using $dst without mounting a tmpfs of $size" >&2
fi
mkdir -p "$dst"
# The copy deletes what SRC lacks, so it only ever writes into an empty folder or its own earlier copy.
marker="$dst/.staged-from"
if [ -n "$(ls -A "$dst")" ] && [ "$(cat "$marker" 2>/dev/null)" != "$src" ]; then
    die "$dst holds other files: pick an empty or new DST"
fi

count() { find "$1" -type f ! -name .staged-from | wc -l; }
bytes() { find "$1" -type f ! -name .staged-from -printf '%s\n' | awk '{ total += $1 } END { print total + 0 }'; }

need=$(bytes "$src")
have=$(( $(df --output=avail -B1 "$dst" | tail -1) + $(bytes "$dst") ))
[ "$need" -le "$have" ] || die "$src needs $need bytes and $dst has $have free: pass a larger SIZE (as root) or another DST"

if command -v rsync >/dev/null; then
    rsync -a --delete --exclude=.staged-from "$src/" "$dst/"
else
    echo "rsync not found: copying with cp -a (install rsync to copy only what changed)" >&2
    find "$dst" -mindepth 1 -maxdepth 1 ! -name .staged-from -exec rm -rf {} + && cp -a "$src/." "$dst/"
fi
echo "$src" > "$marker"

[ "$(count "$src")" -eq "$(count "$dst")" ] || die "copied $(count "$dst") files of $(count "$src")"
[ "$(bytes "$src")" -eq "$(bytes "$dst")" ] || die "copied $(bytes "$dst") bytes of $(bytes "$src")"
echo "staged $(count "$dst") files, $need bytes, in $dst"
if [ -f "$dst/pack.json" ]; then
    echo "train with: format.path=$dst"
else
    echo "train with: data.root=$dst"
fi
