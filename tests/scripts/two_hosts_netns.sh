#!/usr/bin/env bash
# Two ranks on two "hosts" through launch/run.sh --hostfile (issue 37): each rank lives in a
# network namespace of its own, joined only by a veth pair the script makes, and Open MPI reaches
# the second host through an rsh agent that enters its namespace (as ssh would enter another
# machine). Passes when the 2-stage pipeline's training losses equal those of the same run on
# one host, and the pipeline's messages crossed the veth pair (its byte counters grew by more
# than the activations and gradients sent).
# Needs root's CAP_NET_ADMIN (`ip netns add`); without it the script says why and exits 77
# (ctest's skip).
#   tests/scripts/two_hosts_netns.sh --build DIR [--steps N]
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
source "$root/tests/scripts/common.sh"
build_and_steps "$root" 6 "$@"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
export FREERIDE_BIND=none BUILD_DIR=$build
work=$(mktemp -d /tmp/freeride_netns.XXXXXX)
mark=$(new_run_mark)
# Names and a subnet of this run's own, so concurrent runs do not meet.
tag=$(basename "$work" | tr -dc 'a-zA-Z0-9' | tail -c 6)
ns_a=fr_a_$tag ns_b=fr_b_$tag veth_a=fra$tag veth_b=frb$tag
net=10.$((200 + RANDOM % 50)).$((RANDOM % 250))
ip_a=$net.1 ip_b=$net.2
cleanup() {
  kill_marked "$mark"
  ip netns del "$ns_a" 2> /dev/null || true
  ip netns del "$ns_b" 2> /dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
trap "exit 1" TERM INT
fail() { echo "FAIL: $*" >&2; tail -40 "$work"/log_*.txt >&2 || true; exit 1; }
skip() { echo "SKIPPED: $*"; exit 77; }

command -v ip > /dev/null || skip "no ip(8) (Debian's iproute2) to make network namespaces"
ip netns add "$ns_a" 2> /dev/null || skip "ip netns add is not permitted here (needs CAP_NET_ADMIN)"
ip netns add "$ns_b"
ip link add "$veth_a" type veth peer name "$veth_b" ||
  skip "no veth pair can be made here (the kernel lacks veth)"
ip link set "$veth_a" netns "$ns_a"
ip link set "$veth_b" netns "$ns_b"
ip -n "$ns_a" addr add "$ip_a/24" dev "$veth_a"
ip -n "$ns_b" addr add "$ip_b/24" dev "$veth_b"
# Loopback up too: a process reaching its own host's address goes through lo, as on a machine.
for ns in "$ns_a" "$ns_b"; do ip -n "$ns" link set lo up; done
ip -n "$ns_a" link set "$veth_a" up
ip -n "$ns_b" link set "$veth_b" up

# Open MPI starts the remote host's daemon as `AGENT HOST COMMAND...`: enter HOST's namespace.
cat > "$work/netns_agent.sh" << AGENT
#!/usr/bin/env bash
host=\$1
shift
case \$host in
  $ip_a) ns=$ns_a ;;
  $ip_b) ns=$ns_b ;;
  *) echo "netns_agent: unknown host \$host" >&2; exit 255 ;;
esac
exec ip netns exec "\$ns" /bin/sh -c "\$*"
AGENT
chmod +x "$work/netns_agent.sh"
printf '%s slots=1\n%s slots=1\n' "$ip_a" "$ip_b" > "$work/hostfile"

freeride=$build/freeride
prepare_corpus "$freeride" "$root" "$work/data" 512
cat > "$work/run.toml" << TOML
$(tiny_run_toml 5 "$work/data" 4 $steps)
[parallel]
pp = 2
[runtime]
comm_timeout_s = 120
[freeride]
enabled = false
TOML

# Messages only over TCP on the veth subnet: no shared memory between the "hosts".
tcp_only=(--mca btl tcp,self --mca btl_tcp_if_include "$net.0/24" --mca oob_tcp_if_include
  "$net.0/24")
tx_bytes() { ip netns exec "$ns_a" cat "/sys/class/net/$veth_a/statistics/tx_bytes"; }
sent_before=$(tx_bytes)
FREERIDE_RUN_MARK=$mark ip netns exec "$ns_a" "$root/launch/run.sh" -n 2 \
  --hostfile "$work/hostfile" "$work/run.toml" --set "run.dir=\"$work/two_hosts\"" -- \
  --mca plm_rsh_agent "$work/netns_agent.sh" "${tcp_only[@]}" > "$work/log_two_hosts.txt" 2>&1 ||
  fail "the two-host run failed"
sent=$(($(tx_bytes) - sent_before))

FREERIDE_RUN_MARK=$mark "$root/launch/run.sh" -n 2 "$work/run.toml" \
  --set "run.dir=\"$work/one_host\"" > "$work/log_one_host.txt" 2>&1 || fail "the one-host run failed"

two=$(train_losses "$work/two_hosts")
one=$(train_losses "$work/one_host")
echo "one host:  $one"
echo "two hosts: $two"
[[ $(python3 -c 'import sys; print(len(eval(sys.argv[1])))' "$one") == "$steps" ]] ||
  fail "the one-host run logged no $steps train losses"
[[ $two == "$one" ]] || fail "the two-host losses differ from the one-host run's"
# Stage 0 sends each micro-batch's activations (batch_size × seq_len × n_embd floats) per step.
activations=$((steps * 4 * 32 * 32 * 4))
echo "bytes out of host A's veth: $sent (activations alone: $activations)"
((sent > activations)) || fail "the pipeline's messages did not cross the veth pair"
echo "PASS: 2 ranks in two network namespaces over TCP train as on one host"
