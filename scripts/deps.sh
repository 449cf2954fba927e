#!/usr/bin/env bash
# Checks the Debian packages the build and tests need; installs the missing
# ones when run as root with apt-get, otherwise names them and fails.
#   scripts/deps.sh          build + test dependencies
#   scripts/deps.sh --check  only report
set -u
pkgs=(build-essential pkg-config libluajit-5.1-dev luajit libuv1-dev libmsgpack-dev libsodium-dev
      libopenblas-dev zlib1g-dev libcmocka-dev lua-busted libedit-dev libncurses-dev bc procps tmux)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "${1:-}" != "--check" ] && [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then
  echo "installing: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq && apt-get install -y -qq "${missing[@]}" >/dev/null && exit 0
  echo "apt-get install failed" >&2
  exit 1
fi
echo "missing Debian packages: ${missing[*]}" >&2
echo "install them with: sudo apt-get install ${missing[*]}" >&2
exit 1
