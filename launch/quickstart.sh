#!/usr/bin/env bash
# The README's first command: installs what is missing, builds, and runs the main job on the
# embedded default config. Today that is what the project can really do: report the build
# and devices and validate the default run's configuration. Later issues grow it into
# "train a small GPT as a pipeline with side tasks in its bubbles and print the report".
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${BUILD_DIR:-$root/build}
"$root/launch/install_deps.sh"
"$root/launch/build.sh"
cd "$root"
echo "== build"
"$build/freeride" version
echo "== devices"
"$build/freeride" devices
echo "== effective config of the default run (configs/tiny_cpu.toml, embedded)"
"$build/freeride" config check
