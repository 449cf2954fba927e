#!/usr/bin/env bash
# Checks the Debian packages the build and tests need; installs the missing
# ones when run as root with apt-get, otherwise names them and fails.
#   scripts/deps.sh          build + test dependencies
#   scripts/deps.sh --tests  and the optional test-only ones (make test); missing, they only warn
#   scripts/deps.sh --check  only report
set -u
pkgs=(build-essential pkg-config libluajit-5.1-dev luajit libuv1-dev libmsgpack-dev libsodium-dev
      libopenblas-dev zlib1g-dev libcmocka-dev lua-busted lua-cjson libedit-dev libncurses-dev libzmq3-dev libssl-dev bc procps tmux
      fortunes) # fortunes: the English text examples/gpt.lua trains on (/usr/share/games/fortunes)
# Optional, for tests only: plot_spec renders SVG plots in headless Chromium
# and decodes the PNG with Pillow; jupyter_spec drives the Jupyter kernel with
# jupyter_client, runs the example notebook with nbclient and, in a browser,
# with the classic notebook server, selenium and chromedriver; tests/limits.sh
# measures C functions with Universal Ctags. Without them
# those checks are pending.
optional=(chromium python3-pil python3-jupyter-client python3-nbclient python3-nbformat jupyter-notebook
          python3-selenium chromium-driver universal-ctags)
check=0 tests=0
for a in "$@"; do
  case $a in
    --check) check=1 ;;
    --tests) tests=1 ;;
    *) echo "scripts/deps.sh: unknown option '$a' (--check, --tests)" >&2; exit 2 ;;
  esac
done
missing_of() { # packages... -> the ones not installed
  local p
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || echo "$p"
  done
}
mapfile -t missing < <(missing_of "${pkgs[@]}")
opt_missing=()
[ "$tests" -eq 1 ] && mapfile -t opt_missing < <(missing_of "${optional[@]}")
[ ${#missing[@]} -eq 0 ] && [ ${#opt_missing[@]} -eq 0 ] && exit 0
if [ "$check" -eq 0 ] && [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq || { echo "apt-get update failed" >&2; exit 1; }
  if [ ${#missing[@]} -gt 0 ]; then
    echo "installing: ${missing[*]}"
    apt-get install -y -qq "${missing[@]}" >/dev/null || { echo "apt-get install failed" >&2; exit 1; }
  fi
  if [ ${#opt_missing[@]} -gt 0 ]; then
    echo "installing (optional, tests): ${opt_missing[*]}"
    apt-get install -y -qq "${opt_missing[@]}" >/dev/null && exit 0
    echo "could not install ${opt_missing[*]}: plot_spec's rendering and jupyter_spec's checks will be pending" >&2
  fi
  exit 0
fi
if [ ${#opt_missing[@]} -gt 0 ]; then
  echo "optional test packages missing: ${opt_missing[*]} (plot_spec's rendering and jupyter_spec's checks will be pending);" \
    "install them with: sudo apt-get install ${opt_missing[*]}" >&2
fi
[ ${#missing[@]} -eq 0 ] && exit 0
echo "missing Debian packages: ${missing[*]}" >&2
echo "install them with: sudo apt-get install ${missing[*]}" >&2
exit 1
