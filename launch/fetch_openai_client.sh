#!/usr/bin/env bash
# Installs the official `openai` npm client (pinned) into data/npm/, where
# tests/scripts/serve_openai_client.sh looks for it to drive the serve task as a user's program
# would. Does nothing when that version is there already; needs npm (launch/install_deps.sh).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
version=4.95.0
prefix=$root/data/npm
installed=$prefix/node_modules/openai/package.json
if [[ -f $installed ]] && grep -q "\"version\": \"$version\"" "$installed"; then
  exit 0
fi
if ! command -v npm >/dev/null; then
  echo "fetch_openai_client: npm not found (launch/install_deps.sh installs it)" >&2
  exit 1
fi
mkdir -p "$prefix"
echo "fetch_openai_client: npm install openai@$version into $prefix"
npm install --silent --no-audit --no-fund --prefix "$prefix" "openai@$version"
