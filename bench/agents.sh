# bench/agents.sh: sourced by the benchmarks that start local host agents.
# Needs B (the build directory), dir (a scratch directory) and the array pids.
#   start_agents N [ARG...]   starts N agents on 127.0.0.1 (all first, then
#                    waits for all), each with ARGs (e.g. --simulate), adds
#                    their pids to pids, writes $dir/hosts (one per line, in
#                    order); exits non-zero naming an agent that did not start
start_agents() {
  local n=$1 i t up
  shift
  : >"$dir/hosts"
  for i in $(seq 1 "$n"); do
    $B/bin/monarch-worker --listen 127.0.0.1:0 "$@" >"$dir/agent$i.log" 2>&1 &
    pids+=($!)
  done
  # One look at all the logs per round, not a process per agent: thousands start within seconds.
  for t in $(seq 1 $((200 + n / 8))); do
    # A log a just-forked agent has not created yet is not an error: it is not up yet.
    up=$(seq -f "$dir/agent%.0f.log" 1 "$n" | xargs cat 2>/dev/null | grep -c "listening on" || true)
    [ "$up" -ge "$n" ] && break
    sleep 0.025
  done
  seq -f "$dir/agent%.0f.log" 1 "$n" |
    xargs awk '/listening on/ { a = $0; sub(/.*listening on /, "", a); sub(/ .*/, "", a); print a; nextfile }' \
      >"$dir/hosts"
  if [ "$(wc -l <"$dir/hosts")" -ne "$n" ]; then
    for i in $(seq 1 "$n"); do
      grep -q "listening on" "$dir/agent$i.log" || { echo "agent $i of $n did not start: $(cat "$dir/agent$i.log")"; exit 1; }
    done
  fi
}
