#!/usr/bin/env bash
# Idempotent set-up for Kiln on a fresh Debian machine:
#   - apt packages (only when missing): gcc-arm-none-eabi, libnewlib-arm-none-eabi, qemu-system-arm
#   - a virtualenv at .venv with Kiln installed in editable mode and pinned dependencies
#   - the QEMU instruction-counting plugin (built into .venv/share/kiln)
# Usage: bash scripts/setup.sh [--test]   (--test also installs the test extras)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
extras=""
[ "${1:-}" = "--test" ] && extras="[test]"

say() { printf '[kiln setup] %s\n' "$*"; }

need_apt=()
command -v arm-none-eabi-gcc >/dev/null || need_apt+=(gcc-arm-none-eabi)
[ -f /usr/lib/arm-none-eabi/newlib/libc.a ] || [ -d /usr/lib/arm-none-eabi/newlib ] || need_apt+=(libnewlib-arm-none-eabi)
command -v qemu-system-arm >/dev/null || need_apt+=(qemu-system-arm)
if [ ${#need_apt[@]} -gt 0 ]; then
  say "installing apt packages: ${need_apt[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
else
  say "apt packages present"
fi

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  say "creating .venv"
  $PY -m venv .venv
fi
stamp=.venv/.kiln-installed$extras
req_hash=$(cat pyproject.toml | sha256sum | cut -c1-16)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$req_hash" ]; then
  say "installing Python dependencies (pinned in pyproject.toml)"
  .venv/bin/python -m pip install -q --upgrade pip >/dev/null
  .venv/bin/python -m pip install -q -e ".$extras"
  echo "$req_hash" > "$stamp"
else
  say "Python dependencies up to date"
fi

# QEMU TCG plugin that counts executed instructions between two marker functions
plugin=.venv/share/kiln/libicount.so
if [ ! -f "$plugin" ] || [ firmware/qemu_plugin/icount.c -nt "$plugin" ]; then
  if [ -f firmware/qemu_plugin/icount.c ]; then
    say "building QEMU instruction-count plugin"
    mkdir -p .venv/share/kiln
    gcc -shared -fPIC -O2 -o "$plugin" firmware/qemu_plugin/icount.c $(pkg-config --cflags glib-2.0 2>/dev/null || true)
  fi
fi
say "ready: $ROOT/.venv/bin/kiln"
