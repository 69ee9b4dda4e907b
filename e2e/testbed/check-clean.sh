#!/usr/bin/env bash
# Checks that a test bed left nothing behind on the host: run `check-clean.sh snapshot FILE` before
# up.sh and `check-clean.sh verify FILE` after down.sh (make test-e2e does). Compares processes of the
# test bed's binaries, mounts and files under the state directory, network namespaces, links,
# iptables rules, the real node's cgroups and sysctls, and the files the real node creates in /run
# and /var/log. Exits 1 and lists what the test bed left behind.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
DIR="${DBOP_TESTBED_DIR:-$REPO_ROOT/.testbed}"
mode="${1:-}" file="${2:-}"
[[ ( "$mode" == snapshot || "$mode" == verify ) && -n "$file" ]] || die "usage: check-clean.sh snapshot|verify FILE"

state() {
  local p exe s
  for p in /proc/[0-9]*; do
    exe="$(readlink "$p/exe" 2>/dev/null)" || continue
    case "$(basename "$exe")" in
      etcd | kube-apiserver | kube-controller-manager | kube-scheduler | kwok | kubelet | kube-proxy | coredns | containerd | containerd-shim-runc-v2)
        # (only this test bed's: other test beds on the machine come and go)
        [[ "$(tr '\0' ' ' 2>/dev/null <"$p/cmdline")" == *"$DIR/"* ]] && echo "process $exe" ;;
    esac
  done
  awk -v d="$DIR" 'index($5, d) == 1 {print "mount " $5}' /proc/self/mountinfo
  awk '$5 ~ "^/run/netns/|^/var/run/netns/" {print "mount " $5}' /proc/self/mountinfo
  ip -o link show | awk -F': ' '{sub(/@.*/, "", $2); print "link " $2}'
  for ipt in iptables ip6tables; do
    command -v "$ipt-save" >/dev/null || continue
    for t in filter nat mangle; do
      "$ipt-save" -t "$t" 2>/dev/null | grep -E '^(-A|:)' | grep -E 'KUBE-|DBOP-|CNI-' | sed "s/^/$ipt $t /" || true
    done
  done
  for s in /sys/fs/cgroup/*/dbop-testbed /sys/fs/cgroup/dbop-testbed; do [[ -e "$s" ]] && echo "cgroup $s"; done
  for s in vm.overcommit_memory kernel.panic kernel.panic_on_oops net.ipv4.ip_forward net.bridge.bridge-nf-call-iptables \
    net.bridge.bridge-nf-call-ip6tables net.ipv4.conf.all.route_localnet net.netfilter.nf_conntrack_max; do
    echo "sysctl $s=$(sysctl -n "$s" 2>/dev/null || echo absent)"
  done
  for s in /run/containerd /var/log/containers /run/dbop-testbed-real-node.owner "$DIR/node" "$DIR/node2" "$DIR/pids"; do
    [[ -e "$s" ]] && echo "path $s"
  done
  return 0
}

if [[ "$mode" == snapshot ]]; then
  state | sort > "$file"
  log "host state recorded in $file ($(wc -l < "$file") entries)"
  exit 0
fi
[[ -f "$file" ]] || die "no snapshot $file"
now="$(mktemp)"
state | sort > "$now"
# Judged line by line: what is here now and was not before is left behind. What was here before and
# is gone was left by an earlier test bed whose session ended without down.sh (node-up.sh cleans up
# a real node nobody runs); it is reported, not held against this one. A sysctl's value is judged
# the same way, except after such a clean-up: node-down.sh then restored the values that earlier
# test bed had saved, the host's own, not the ones this snapshot found.
added="$(comm -13 "$file" "$now")" gone="$(comm -23 "$file" "$now")"
rm -f "$now"
if grep -q '^path /run/dbop-testbed-real-node.owner$' <<<"$gone"; then
  added="$(grep -v '^sysctl ' <<<"$added" || true)"
fi
cleaned="$(grep -v '^sysctl ' <<<"$gone" || true)"
if [[ -n "$cleaned" ]]; then
  log "cleaned up what an earlier test bed had left on the host before this one started:"
  head -n 12 <<<"$cleaned" | sed 's/^/  /' >&2
  (($(wc -l <<<"$cleaned") <= 12)) || log "  … $(wc -l <<<"$cleaned") entries in all"
fi
if [[ -z "$added" ]]; then
  log "clean: the host has nothing the test bed brought (processes, mounts, netns, links, iptables, cgroups, sysctls, paths)"
  exit 0
fi
log "ERROR: the test bed left state behind (a sysctl's value before is under 'was'):"
sed 's/^/  /' <<<"$added" >&2
grep '^sysctl ' <<<"$gone" | sed 's/^/  was: /' >&2 || true
exit 1
