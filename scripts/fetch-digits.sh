#!/usr/bin/env bash
# Fetches the UCI handwritten digits data set (1797 8x8 images, 64 pixel
# values 0..16 then the label 0..9 per CSV row) as Debian ships it in
# python3-sklearn, without installing the package: apt-get download, unpack
# in a temporary directory, copy the one file.
#   scripts/fetch-digits.sh [DEST]      DEST defaults to <repo>/data/digits.csv.gz
# The data is not part of the repository (data/ is git-ignored).
set -euo pipefail

ROWS=1797            # rows in sklearn's digits.csv.gz
FIELDS=65            # 64 pixels + the label
PKG=python3-sklearn
MEMBER=usr/lib/python3/dist-packages/sklearn/datasets/data/digits.csv.gz

here=$(cd "$(dirname "$0")/.." && pwd)
dest=${1:-$here/data/digits.csv.gz}

if [ -s "$dest" ]; then
  echo "fetch-digits: $dest is already there"
  exit 0
fi

advice() {
  cat >&2 <<EOF
fetch-digits: could not get $PKG with apt-get download.
  On Debian or Ubuntu: run 'sudo apt-get update', then run this script again
  ($0). It needs network access to the Debian mirror, but no root.
  Elsewhere: copy sklearn/datasets/data/digits.csv.gz from any scikit-learn
  install (python3 -c 'import sklearn, os; print(os.path.dirname(sklearn.__file__))'
  shows where it is) to $dest.
EOF
  exit 1
}

for tool in apt-get dpkg-deb gzip; do
  command -v "$tool" >/dev/null || { echo "fetch-digits: '$tool' is not installed" >&2; advice; }
done

tmp=$(mktemp -d "${TMPDIR:-/tmp}/fetch-digits.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

# apt drops root to the _apt user for downloads, and _apt cannot write into
# our private temp dir; as root, download as root instead of widening it.
sandbox=()
[ "$(id -u)" -eq 0 ] && sandbox=(-o APT::Sandbox::User=root)

echo "fetch-digits: downloading $PKG (about 2 MB) with apt-get download"
if ! (cd "$tmp" && apt-get download -q "${sandbox[@]}" "$PKG" >"$tmp/apt.log" 2>&1); then
  # A fresh system may have no package lists yet; root can make them.
  if [ "$(id -u)" -eq 0 ] && grep -q "Unable to locate\|has no installation candidate" "$tmp/apt.log"; then
    echo "fetch-digits: no package lists yet; running apt-get update"
    apt-get update -qq >/dev/null 2>&1 || true
    (cd "$tmp" && apt-get download -q "${sandbox[@]}" "$PKG" >"$tmp/apt.log" 2>&1) || { cat "$tmp/apt.log" >&2; advice; }
  else
    cat "$tmp/apt.log" >&2
    advice
  fi
fi

deb=$(ls "$tmp"/"$PKG"_*.deb 2>/dev/null | head -1 || true)
[ -n "$deb" ] || { echo "fetch-digits: apt-get reported success but left no .deb in $tmp" >&2; advice; }
dpkg-deb -x "$deb" "$tmp/x"
src=$tmp/x/$MEMBER
[ -f "$src" ] || { echo "fetch-digits: $(basename "$deb") has no $MEMBER (the package layout changed?)" >&2; exit 1; }

# Check the shape before anyone trains on it.
rows=$(gzip -dc "$src" | grep -c .)
bad=$(gzip -dc "$src" | awk -F, -v n="$FIELDS" 'NF != n' | wc -l)
if [ "$rows" -ne "$ROWS" ] || [ "$bad" -ne 0 ]; then
  echo "fetch-digits: $MEMBER has $rows rows ($bad not of $FIELDS fields); expected $ROWS rows of $FIELDS" >&2
  exit 1
fi

mkdir -p "$(dirname "$dest")"
cp "$src" "$dest.tmp.$$"
mv -f "$dest.tmp.$$" "$dest" # atomic: a reader never sees half a file
echo "fetch-digits: wrote $dest ($rows rows, from $(basename "$deb"))"
