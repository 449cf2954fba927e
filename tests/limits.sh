#!/usr/bin/env bash
# The size rules of the house (STYLE.md, issue 27): no source file over 800
# lines, no C function over 80. A function is a definition that starts at
# column 0 and ends at the first "}" at column 0 (clang-format's layout), or
# where Universal Ctags says it ends when it is installed.
# Prints one line; exit 1 naming each file or function over its limit.
set -u
cd "$(dirname "$0")/.."
FILE_MAX=800 # lines per source file
FUNC_MAX=80  # lines per C function, its signature and closing brace included
bad=0
files=$(git ls-files 'host/*' 'lua/*' 'kernels/*' 'tests/*' 'examples/*' 'bench/*' 'deploy/*' 'scripts/*' 2>/dev/null |
  grep -E '\.(c|h|cu|lua|sh|py)$')
[ -n "$files" ] || files=$(find host lua kernels tests examples bench -type f | grep -E '\.(c|h|cu|lua|sh|py)$')
nfiles=0
for f in $files; do
  [ -f "$f" ] || continue
  nfiles=$((nfiles + 1))
  n=$(wc -l <"$f")
  if [ "$n" -gt "$FILE_MAX" ]; then
    echo "limits: $f has $n lines (at most $FILE_MAX: split it by idea)"
    bad=1
  fi
done
cfiles=$(for f in $files; do case $f in *.c | *.cu | *.h) [ -f "$f" ] && echo "$f" ;; esac; done)
# Universal Ctags parses C and knows where each function ends (its "end:" field), whatever the layout; without
# it, the column-0 rule below (which a "}" at column 0 inside a function would cut short).
if ctags --version 2>/dev/null | grep -q "Universal Ctags"; then
  long=$(echo "$cfiles" | xargs ctags --langmap=C:+.cu --languages=C --kinds-C=f --fields=+ne -o - 2>/dev/null | awk -F'\t' -v max="$FUNC_MAX" '
    { s = 0; e = 0
      for (i = 4; i <= NF; i++) { if ($i ~ /^line:/) s = substr($i, 6) + 0; if ($i ~ /^end:/) e = substr($i, 5) + 0 }
      if (s > 0 && e - s + 1 > max) printf "limits: %s:%d: %s is %d lines (at most %d)\n", $2, s, $1, e - s + 1, max }')
else
long=$(echo "$cfiles" | xargs awk -v max="$FUNC_MAX" '
  FNR == 1 { start = 0 }
  start == 0 && /^[A-Za-z_].*\)[ \t]*\{[ \t]*$/ && !/^(struct|typedef|enum|union)/ { start = FNR; name = $0; next }
  start > 0 && /^\}/ {
    if (FNR - start + 1 > max) { sub(/\(.*/, "", name); printf "limits: %s:%d: %s is %d lines (at most %d)\n", FILENAME, start, name, FNR - start + 1, max }
    start = 0
  }')
fi
if [ -n "$long" ]; then
  echo "$long"
  bad=1
fi
# The training library (issue 28): no function over LUA_FUNC_MAX lines. A top-level function starts at column 0
# ("function" or "local function") and ends at the first "end" at column 0.
LUA_FUNC_MAX=60
lualong=$(awk -v max="$LUA_FUNC_MAX" '
  FNR == 1 { start = 0 }
  start == 0 && /^(local )?function / { start = FNR; name = $0; next }
  start > 0 && /^end/ {
    if (FNR - start + 1 > max) { sub(/\(.*/, "", name); printf "limits: %s:%d: %s is %d lines (at most %d)\n", FILENAME, start, name, FNR - start + 1, max }
    start = 0
  }' lua/monarch/train*.lua)
if [ -n "$lualong" ]; then
  echo "$lualong"
  bad=1
fi
[ "$bad" -eq 0 ] && echo "limits: $nfiles source files of at most $FILE_MAX lines, no C function over $FUNC_MAX, no function of the training library over $LUA_FUNC_MAX"
exit "$bad"
