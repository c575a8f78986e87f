# Sourced by the sample scripts: start_workers N [pipit-worker flags...] starts N pipit-worker
# processes on 127.0.0.1 (ephemeral ports, logs in $run_dir) and sets `workers` to their
# host:port list, comma-separated. await_workers HOST... waits for workers a script started
# itself, one HOST each (worker i writing its port to $run_dir/port$i and its log to
# $run_dir/worker$i.log), and sets `workers` alike. The caller sets run_dir and traps
# cleanup_workers on exit.
pids=()
cleanup_workers() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$run_dir"
}

start_workers() {
  local count=$1
  shift
  local hosts=() i
  for ((i = 0; i < count; i++)); do
    ./build/pipit-worker --listen 127.0.0.1:0 --port-file "$run_dir/port$i" "$@" \
      2>"$run_dir/worker$i.log" &
    pids+=($!)
    hosts+=(127.0.0.1)
  done
  await_workers "${hosts[@]}"
}

await_workers() {
  local endpoints=() i=0 host
  for host in "$@"; do
    for _ in $(seq 100); do [[ -s "$run_dir/port$i" ]] && break; sleep 0.1; done
    [[ -s "$run_dir/port$i" ]] || { echo "worker $i did not start:"; cat "$run_dir/worker$i.log"; exit 1; }
    endpoints+=("$host:$(cat "$run_dir/port$i")")
    i=$((i + 1))
  done
  workers=$(IFS=,; echo "${endpoints[*]}")
}
