#!/usr/bin/env bash
# Trains the demo GPT across a small cluster of network "hosts" on this machine: network
# namespaces joined by veth pairs and a bridge, each with its own address and one
# pipit-worker, every host's link shaped by tc (netem delay + rate where the kernel has netem,
# a tbf rate limit otherwise). Then trains the same run in one process and compares the
# weights' checksums, and prints the timeline of the last steps across the hosts. With --mpi
# the stages are MPI ranks on the hosts instead (mpirun, through a launch agent that enters
# the namespaces in place of ssh), as on a cluster.
#   sudo samples/netns_cluster.sh                          # 4 hosts, 200mbit, 1ms
#   sudo samples/netns_cluster.sh --hosts 2 --rate 1gbit --delay 5ms -- --steps 50
#   sudo samples/netns_cluster.sh --mpi
# Arguments after -- go to train_gpt. Needs root and iproute2; cleans everything up on exit.
set -euo pipefail
cd "$(dirname "$0")/.."

hosts=4 rate=200mbit delay=1ms mpi=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --hosts) hosts=$2; shift 2 ;;
    --rate) rate=$2; shift 2 ;;
    --delay) delay=$2; shift 2 ;;
    --mpi) mpi=1; shift ;;
    --) shift; break ;;
    *) echo "netns_cluster: unknown flag '$1' (--hosts N, --rate R, --delay D, --mpi, -- train_gpt flags)" >&2; exit 2 ;;
  esac
done
[[ $(id -u) == 0 ]] || { echo "netns_cluster: needs root (network namespaces)" >&2; exit 1; }
command -v ip >/dev/null || { echo "netns_cluster: needs iproute2 (ip, tc)" >&2; exit 1; }

bash tools/install_deps.sh >/dev/null
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)" --target pipit-worker train_gpt >/dev/null

tag=$$ subnet=10.78.$(($$ % 250))
run_dir=$(mktemp -d)
source samples/local_workers.sh
cleanup() {
  cleanup_workers
  for ((i = 0; i < hosts; i++)); do
    ip netns del "pn$tag-$i" 2>/dev/null || true
    ip link del "pv$tag-$i" 2>/dev/null || true
  done
  ip link del "pb$tag" 2>/dev/null || true
}
trap cleanup EXIT

# The bridge is the network; this shell (the coordinator's host) sits on it at .254.
ip link add "pb$tag" type bridge
ip addr add "$subnet.254/24" dev "pb$tag"
ip link set "pb$tag" up
shaping=""
for ((i = 0; i < hosts; i++)); do
  ns="pn$tag-$i" inner="pe$tag-$i" outer="pv$tag-$i"
  ip netns add "$ns"
  ip link add "$outer" type veth peer name "$inner"
  ip link set "$inner" netns "$ns"
  ip -n "$ns" addr add "$subnet.$((i + 1))/24" dev "$inner"
  ip -n "$ns" link set "$inner" up
  ip -n "$ns" link set lo up
  ip link set "$outer" master "pb$tag"
  ip link set "$outer" up
  if ip netns exec "$ns" tc qdisc add dev "$inner" root netem delay "$delay" rate "$rate" 2>/dev/null; then
    shaping="netem: $delay delay, $rate"
  else
    ip netns exec "$ns" tc qdisc add dev "$inner" root tbf rate "$rate" burst 256kb latency 50ms
    shaping="tbf: $rate (this kernel has no netem qdisc, so no added delay)"
  fi
done

flags=(--steps 30 --threads 1 --sample 0 "$@")
addresses=()
for ((i = 0; i < hosts; i++)); do addresses+=("$subnet.$((i + 1))"); done
if ((mpi)); then
  cat >"$run_dir/agent.sh" <<AGENT
#!/bin/sh
# mpirun calls: AGENT HOST COMMAND...; HOST $subnet.(i+1) is namespace pn$tag-i.
host=\$1; shift
exec ip netns exec pn$tag-\$(( \${host##*.} - 1 )) /bin/sh -c "\$*"
AGENT
  chmod 700 "$run_dir/agent.sh"
  host_list=$(IFS=,; echo "${addresses[*]}")
  echo "netns_cluster: $hosts MPI ranks on $host_list, links shaped by $shaping"
  mpirun --allow-run-as-root --host "$host_list" --mca plm_rsh_agent "$run_dir/agent.sh" \
    --mca plm_rsh_no_tree_spawn 1 \
    --mca oob_tcp_if_include "$subnet.0/24" --mca btl tcp,self \
    --mca btl_tcp_if_include "$subnet.0/24" -np "$hosts" \
    ./build/train_gpt --launcher mpi "${flags[@]}" | tee "$run_dir/cluster.log"
else
  (umask 077; head -c 32 /dev/urandom | od -An -tx1 | tr -d " \n" >"$run_dir/token")
  for ((i = 0; i < hosts; i++)); do
    # Every "host" here shares this machine's cores, so one thread each; on real hosts the
    # workers' default (the host's cores over its stages) is right.
    ip netns exec "pn$tag-$i" ./build/pipit-worker --listen "$subnet.$((i + 1)):0" \
      --port-file "$run_dir/port$i" --token-file "$run_dir/token" --threads 1 \
      2>"$run_dir/worker$i.log" &
    pids+=($!)
  done
  await_workers "${addresses[@]}"
  echo "netns_cluster: $hosts hosts at $workers, links shaped by $shaping"

  ./build/train_gpt --workers "$workers" --token-file "$run_dir/token" \
    --trace "$run_dir/trace.json" "${flags[@]}" | tee "$run_dir/cluster.log"
fi
echo "--- the same run in one process:"
./build/train_gpt --stages "$hosts" "${flags[@]}" | tee "$run_dir/local.log" | grep CRC
if [[ "$(grep CRC "$run_dir/cluster.log")" == "$(grep CRC "$run_dir/local.log")" ]]; then
  echo "netns_cluster: the cluster's weights equal the in-process run's, bit for bit"
else
  echo "netns_cluster: the weights differ from the in-process run's" >&2
  exit 1
fi
