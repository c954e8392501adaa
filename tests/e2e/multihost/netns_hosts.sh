#!/usr/bin/env bash
# Two "hosts" for the multi-host launcher tests: network namespaces on this machine joined by a
# veth pair, each with its own address and its own sshd (Debian's openssh-server) accepting root
# logins with a key generated into WORKDIR. The hosts share this machine's file system, so the
# binaries are at the same path on both, as on a cluster with a shared home.
#
#   netns_hosts.sh serve WORKDIR   set up, print one line
#                                  "READY host_a=IP host_b=IP ns_a=NS ns_b=NS ssh_config=FILE if_a=IF if_b=IF",
#                                  then wait until stdin closes and tear everything down
#   netns_hosts.sh check           exit 0 if this machine can do it, else print why and exit 3
#
# Teardown runs from an EXIT trap, so a test that dies (closing our stdin) or a failed setup
# leaves no namespace, veth or sshd behind. Processes still inside the namespaces (ranks a failed
# test left) are killed by pid before the namespaces are deleted.
set -euo pipefail

die_skip() { echo "SKIP: $*"; exit 3; }

check() {
  [ "$(id -u)" -eq 0 ] || die_skip "needs root for 'ip netns' and sshd (CI runs as root)"
  command -v ip >/dev/null || die_skip "'ip' not found (Debian: apt-get install iproute2)"
  [ -x /usr/sbin/sshd ] || die_skip "/usr/sbin/sshd not found (Debian: apt-get install openssh-server)"
  command -v ssh >/dev/null && command -v ssh-keygen >/dev/null ||
    die_skip "ssh/ssh-keygen not found (Debian: apt-get install openssh-client)"
  local probe="dsprobe$$"
  ip netns add "$probe" 2>/dev/null || die_skip "'ip netns add' failed: no network-namespace support here"
  ip netns del "$probe"
}

mode=${1:-}
case "$mode" in
  check) check; exit 0 ;;
  serve) ;;
  *) echo "usage: $0 serve WORKDIR | check" >&2; exit 2 ;;
esac
work=${2:?usage: $0 serve WORKDIR}
check

tag="ds$$"
ns_a="${tag}a"; ns_b="${tag}b"
if_a="${tag}va"; if_b="${tag}vb"
net="10.$((200 + $$ % 50)).$(( ($$ / 50) % 250 + 1 ))"
ip_a="$net.1"; ip_b="$net.2"
sshd_pids=()

cleanup() {
  set +e
  for pid in "${sshd_pids[@]}"; do kill "$pid" 2>/dev/null; done
  for ns in "$ns_a" "$ns_b"; do
    if ip netns list | grep -qw "$ns"; then
      for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$pid" 2>/dev/null; done
      ip netns del "$ns"
    fi
  done
  ip link del "$if_a" 2>/dev/null
  for pid in "${sshd_pids[@]}"; do wait "$pid" 2>/dev/null; done
}
trap cleanup EXIT
trap 'exit 1' INT TERM HUP

ip netns add "$ns_a"
ip netns add "$ns_b"
ip link add "$if_a" type veth peer name "$if_b"
ip link set "$if_a" netns "$ns_a"
ip link set "$if_b" netns "$ns_b"
ip -n "$ns_a" addr add "$ip_a/24" dev "$if_a"
ip -n "$ns_b" addr add "$ip_b/24" dev "$if_b"
for ns in "$ns_a" "$ns_b"; do ip -n "$ns" link set lo up; done
ip -n "$ns_a" link set "$if_a" up
ip -n "$ns_b" link set "$if_b" up

ssh-keygen -q -t ed25519 -N '' -f "$work/id_ed25519"
ssh-keygen -q -t ed25519 -N '' -f "$work/host_key"
cp "$work/id_ed25519.pub" "$work/authorized_keys"
cat > "$work/ssh_config" <<CONFIG
Host *
  IdentityFile $work/id_ed25519
  IdentitiesOnly yes
  StrictHostKeyChecking no
  UserKnownHostsFile /dev/null
  LogLevel ERROR
  BatchMode yes
  ConnectTimeout 5
CONFIG
mkdir -p /run/sshd  # sshd's privilege-separation directory

for host in a b; do
  if [ "$host" = a ]; then ns=$ns_a; ip=$ip_a; else ns=$ns_b; ip=$ip_b; fi
  cat > "$work/sshd_$host.conf" <<CONFIG
ListenAddress $ip
HostKey $work/host_key
AuthorizedKeysFile $work/authorized_keys
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
PidFile $work/sshd_$host.pid
LogLevel ERROR
PrintMotd no
MaxStartups 64
MaxSessions 64
CONFIG
  ip netns exec "$ns" /usr/sbin/sshd -D -e -f "$work/sshd_$host.conf" &
  sshd_pids+=($!)
done

for ip in "$ip_a" "$ip_b"; do
  for _ in $(seq 100); do
    if ip netns exec "$ns_a" ssh -F "$work/ssh_config" "$ip" true 2>/dev/null; then continue 2; fi
    sleep 0.1
  done
  echo "netns_hosts: sshd on $ip did not accept a login within 10 s" >&2
  exit 1
done

echo "READY host_a=$ip_a host_b=$ip_b ns_a=$ns_a ns_b=$ns_b ssh_config=$work/ssh_config if_a=$if_a if_b=$if_b"
# Hold the hosts until the test closes our stdin (or dies, which closes it too).
cat >/dev/null || true
