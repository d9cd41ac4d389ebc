#!/usr/bin/env bash
# Idempotent set-up for Kiln on a fresh Debian machine:
#   - apt packages (only when missing): gcc-arm-none-eabi, libnewlib-arm-none-eabi, qemu-system-arm
#     (and ser2net with --test: labgrid's exporter uses it in the board-farm tests)
#     (--test also pocl-opencl-icd and ocl-icd-libopencl1: OpenCL on the CPU for cuda-sim)
#   - a virtualenv at .venv with Kiln (distribution kiln-ml) installed in editable mode, its
#     dependencies at the exact versions locked in constraints.txt (pyproject.toml has the ranges)
#   - the QEMU instruction-counting plugin (built into .venv/share/kiln)
# Usage: bash scripts/setup.sh [--test]   (--test also installs the test and farm extras)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
extras=""
[ "${1:-}" = "--test" ] && extras="[test,farm]"   # farm: labgrid, for the board-farm tests

say() { printf '[kiln setup] %s\n' "$*"; }

need_apt=()
command -v arm-none-eabi-gcc >/dev/null || need_apt+=(gcc-arm-none-eabi)
[ -f /usr/lib/arm-none-eabi/newlib/libc.a ] || [ -d /usr/lib/arm-none-eabi/newlib ] || need_apt+=(libnewlib-arm-none-eabi)
command -v qemu-system-arm >/dev/null || need_apt+=(qemu-system-arm)
# ser2net: labgrid's exporter serves serial ports over RFC 2217 with it (the board-farm tests)
[ "${1:-}" = "--test" ] && { command -v ser2net >/dev/null || [ -x /usr/sbin/ser2net ] || need_apt+=(ser2net); }
# cuda-sim: CUDA packages' kernels run on the CPU through OpenCL (tests; pyopencl comes with [test])
if [ "${1:-}" = "--test" ]; then
  ls /etc/OpenCL/vendors/pocl*.icd >/dev/null 2>&1 || need_apt+=(pocl-opencl-icd)
  ls /usr/lib/*/libOpenCL.so.1 >/dev/null 2>&1 || need_apt+=(ocl-icd-libopencl1)
fi
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
  if ! $PY -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
    say "error: Kiln needs Python >= 3.11 ($PY is $($PY -V 2>&1 || echo missing)): run with PYTHON=python3.11"
    exit 2
  fi
  say "creating .venv"
  $PY -m venv .venv
fi
stamp=.venv/.kiln-installed$extras
# reinstall only when what decides the installed versions changed (or .venv is a fresh one)
req_hash=$(cat pyproject.toml constraints.txt | sha256sum | cut -c1-16)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$req_hash" ]; then
  say "installing Python dependencies (versions locked in constraints.txt)"
  .venv/bin/python -m pip install -q --upgrade pip >/dev/null
  # an editable install made under the old distribution name "kiln" would shadow this one
  if .venv/bin/python -m pip show kiln >/dev/null 2>&1; then
    .venv/bin/python -m pip uninstall -q -y kiln
    rm -rf kiln.egg-info
  fi
  .venv/bin/python -m pip install -q -e ".$extras" -c constraints.txt
  echo "$req_hash" > "$stamp"
else
  say "Python dependencies up to date"
fi

# QEMU TCG plugin that counts executed instructions between two marker functions
plugin=.venv/share/kiln/libicount.so
if [ ! -f "$plugin" ] || [ -n "$(find firmware/qemu_plugin -newer "$plugin" 2>/dev/null)" ]; then
  if [ -f firmware/qemu_plugin/icount.c ]; then
    say "building QEMU instruction-count plugin"
    mkdir -p .venv/share/kiln
    gcc -shared -fPIC -O2 -o "$plugin" firmware/qemu_plugin/icount.c $(pkg-config --cflags glib-2.0 2>/dev/null || true)
  fi
fi
say "ready: $ROOT/.venv/bin/kiln"
