# bench/agents.sh: sourced by the benchmarks that start local host agents.
# Needs B (the build directory), dir (a scratch directory) and the array pids.
#   start_agents N [ARG...]   starts N agents on 127.0.0.1 (all first, then
#                    waits for all), each with ARGs (e.g. --simulate), adds
#                    their pids to pids, writes $dir/hosts (one per line, in
#                    order); exits non-zero naming an agent that did not start.
#                    GROUP=G (with --simulate): G agents per process
#                    (monarch-worker --hosts G), N/G processes, hosts in order.
start_agents() {
  local n=$1 g=${GROUP:-1} i t up left
  shift
  : >"$dir/hosts"
  [ "$g" -ge 1 ] || g=1
  # Process i runs min(g, what is left) agents; its log has one banner line per agent.
  left=$n i=0
  while [ "$left" -gt 0 ]; do
    i=$((i + 1))
    local k=$((left < g ? left : g))
    if [ "$g" -gt 1 ]; then
      $B/bin/monarch-worker --listen 127.0.0.1:0 --hosts "$k" "$@" >"$dir/agent$i.log" 2>&1 &
    else
      $B/bin/monarch-worker --listen 127.0.0.1:0 "$@" >"$dir/agent$i.log" 2>&1 &
    fi
    pids+=($!)
    left=$((left - k))
  done
  local nproc=$i
  # One look at all the logs per round, not a process per agent: thousands start within seconds.
  for t in $(seq 1 $((200 + n / 8))); do
    # A log a just-forked agent has not created yet is not an error: it is not up yet.
    up=$(seq -f "$dir/agent%.0f.log" 1 "$nproc" | xargs cat 2>/dev/null | grep -c "listening on" || true)
    [ "$up" -ge "$n" ] && break
    sleep 0.025
  done
  seq -f "$dir/agent%.0f.log" 1 "$nproc" |
    xargs awk '/listening on/ { a = $0; sub(/.*listening on /, "", a); sub(/ .*/, "", a); print a }' \
      >"$dir/hosts"
  if [ "$(wc -l <"$dir/hosts")" -ne "$n" ]; then
    for i in $(seq 1 "$nproc"); do
      grep -q "listening on" "$dir/agent$i.log" || { echo "agent $i of $n did not start: $(cat "$dir/agent$i.log")"; exit 1; }
    done
  fi
}
