#!/usr/bin/env bash
# Prepares the default corpus: the King James Bible (public domain, Debian package bible-kjv,
# about 4.4 MB of text) tokenized with GPT-2's BPE into llm.c token shards in data/kjv/.
# Idempotent: does nothing when the shards exist. Needs build/freeride (launch/build.sh).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${BUILD_DIR:-$root/build}
out=$root/data/kjv
"$root/launch/fetch_tokenizer.sh"
if compgen -G "$out/train_*.bin" >/dev/null && compgen -G "$out/val_*.bin" >/dev/null; then
  exit 0
fi
if ! command -v bible >/dev/null; then
  echo "prepare_data: the 'bible' program is missing (apt-get install bible-kjv, or" >&2
  echo "  launch/install_deps.sh)" >&2
  exit 1
fi
mkdir -p "$out"
bible -f "Gen1:1-Rev22:21" > "$out/kjv.txt"
"$build/freeride" prepare --input "$out/kjv.txt" --out "$out" --tokenizer "$root/data/r50k_base.tiktoken"
