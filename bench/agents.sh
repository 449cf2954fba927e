# bench/agents.sh: sourced by the benchmarks that start local host agents.
# Needs B (the build directory), dir (a scratch directory) and the array pids.
#   start_agents N   starts N agents on 127.0.0.1 (all first, then waits for
#                    each), adds their pids to pids, writes $dir/hosts
start_agents() {
  local n=$1 i port
  : >"$dir/hosts"
  for i in $(seq 1 "$n"); do
    $B/bin/monarch-worker --listen 127.0.0.1:0 >"$dir/agent$i.log" 2>&1 &
    pids+=($!)
  done
  for i in $(seq 1 "$n"); do
    port=""
    for _ in $(seq 1 200); do
      port=$(sed -n 's/.*listening on [^ ]*:\([0-9]*\).*/\1/p' "$dir/agent$i.log" | head -1)
      [ -n "$port" ] && break
      sleep 0.025
    done
    [ -n "$port" ] || { echo "agent $i did not start: $(cat "$dir/agent$i.log")"; exit 1; }
    echo "127.0.0.1:$port" >>"$dir/hosts"
  done
}
