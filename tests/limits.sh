#!/usr/bin/env bash
# The size rules of the house (STYLE.md, issue 27): no source file over 800
# lines, no C function over 80. A function is a definition that starts at
# column 0 and ends at the first "}" at column 0 (clang-format's layout).
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
long=$(for f in $files; do case $f in *.c | *.cu | *.h) [ -f "$f" ] && echo "$f" ;; esac; done | xargs awk -v max="$FUNC_MAX" '
  FNR == 1 { start = 0 }
  start == 0 && /^[A-Za-z_].*\)[ \t]*\{[ \t]*$/ && !/^(struct|typedef|enum|union)/ { start = FNR; name = $0; next }
  start > 0 && /^\}/ {
    if (FNR - start + 1 > max) { sub(/\(.*/, "", name); printf "limits: %s:%d: %s is %d lines (at most %d)\n", FILENAME, start, name, FNR - start + 1, max }
    start = 0
  }')
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
