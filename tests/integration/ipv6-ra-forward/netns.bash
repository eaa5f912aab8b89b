# Sourced by the ipv6-ra-forward integration tests and its benchmark: network namespaces,
# veth pairs and radvd routers that advertise rarely, cleaned up on exit.
# shellcheck shell=bash

# Every name carries this prefix, so that only our own namespaces are ever deleted.
NS_PREFIX="iraf$$"
NS_CREATED=()
RADVD_PIDFILES=()
RADVD_STARTED=0
export RADVD_STARTED
NS_WORK=$(mktemp -d /tmp/ipv6-ra-forward-test.XXXXXX)

ns_cleanup() {
    local pidfile ns
    set +e  # the trap runs under the test's set -e: clean up everything regardless
    for pidfile in "${RADVD_PIDFILES[@]}"; do
        [ -s "$pidfile" ] && kill "$(cat "$pidfile")" 2>/dev/null
    done
    for ns in "${NS_CREATED[@]}"; do
        ip netns del "$ns" 2>/dev/null
        rm -rf "/etc/netns/$ns"
    done
    rmdir /etc/netns 2>/dev/null
    rm -rf "$NS_WORK"
    return 0
}

# ns_new NAME: a network namespace with lo up, recorded for ns_cleanup (so never
# call it in a $(...) subshell). NAME must start with $NS_PREFIX-.
ns_new() {
    case $1 in "$NS_PREFIX"-*) ;; *) fail "namespace $1 lacks the prefix $NS_PREFIX-" ;; esac
    ip netns add "$1" || fail "ip netns add $1"
    NS_CREATED+=("$1")
    ip -n "$1" link set lo up
}

# in_ns NS CMD...: run CMD in NS (with /etc/netns/NS/* over /etc/*, as ip netns exec does).
in_ns() { local ns=$1; shift; ip netns exec "$ns" "$@"; }

sysctl_get() { in_ns "$1" cat "/proc/sys/net/ipv6/conf/$2/$3"; }
# sysctl_is NS IFACE KEY VALUE (for wait_until, which re-runs it)
sysctl_is() { [ "$(sysctl_get "$1" "$2" "$3" 2>/dev/null)" = "$4" ]; }

# radvd_start NS IFACE...: radvd advertising 2001:db8:N::/64 on each IFACE, unsolicited
# only every 150..200 s (after its three initial advertisements, at most 16 s apart), so
# that a quick answer can only come from a router solicitation.
radvd_start() {
    local ns=$1 iface n=0 conf
    shift
    conf="$NS_WORK/radvd-$ns.conf"
    : >"$conf"
    for iface in "$@"; do
        n=$((n + 1))
        cat >>"$conf" <<RADVD
interface $iface {
    AdvSendAdvert on;
    IgnoreIfMissing on;
    MinRtrAdvInterval 150;
    MaxRtrAdvInterval 200;
    AdvDefaultLifetime 1800;
    prefix 2001:db8:$n::/64 { AdvOnLink on; AdvAutonomous on; };
};
RADVD
    done
    in_ns "$ns" sysctl -qw net.ipv6.conf.all.forwarding=1
    RADVD_PIDFILES+=("$NS_WORK/radvd-$ns.pid")
    in_ns "$ns" radvd -C "$conf" -p "$NS_WORK/radvd-$ns.pid" -m logfile \
        -l "$NS_WORK/radvd-$ns.log" || fail "radvd did not start in $ns"
    RADVD_STARTED=$SECONDS
}

# radvd_start_solicited NS IFACE...: radvd that sends no unsolicited advertisement at all
# (UnicastOnly; MaxRtrAdvInterval 600 besides): every RA is the answer to a solicitation.
radvd_start_solicited() {
    local ns=$1 iface n=0 conf
    shift
    conf="$NS_WORK/radvd-$ns.conf"
    : >"$conf"
    for iface in "$@"; do
        n=$((n + 1))
        cat >>"$conf" <<RADVD
interface $iface {
    AdvSendAdvert on;
    UnicastOnly on;
    MinRtrAdvInterval 450;
    MaxRtrAdvInterval 600;
    AdvDefaultLifetime 1800;
    prefix 2001:db8:$n::/64 { AdvOnLink on; AdvAutonomous on; };
};
RADVD
    done
    in_ns "$ns" sysctl -qw net.ipv6.conf.all.forwarding=1
    RADVD_PIDFILES+=("$NS_WORK/radvd-$ns.pid")
    in_ns "$ns" radvd -C "$conf" -p "$NS_WORK/radvd-$ns.pid" -m logfile \
        -l "$NS_WORK/radvd-$ns.log" || fail "radvd did not start in $ns"
}

# snmp6 NS COUNTER: an ICMPv6 counter of the namespace (Icmp6InRouterSolicits...).
# shellcheck disable=SC2016 # awk's own $1 and $2
snmp6() { in_ns "$1" awk -v k="$2" '$1 == k { print $2 }' /proc/net/snmp6; }

# ra_route NS IFACE: the RA-learned default route of IFACE, if any.
ra_route() { ip -n "$1" -6 route show default dev "$2" proto ra 2>/dev/null; }
# has_ra_route NS IFACE: true when there is one (ip itself exits 0 on an empty list).
has_ra_route() { [ -n "$(ra_route "$1" "$2")" ]; }
slaac_addr() { ip -n "$1" -6 addr show dev "$2" scope global dynamic 2>/dev/null | grep -o 'inet6 [^ ]*'; }

# wait_until SECONDS CMD...: poll CMD every 0.1 s; true as soon as it succeeds.
wait_until() {
    local limit=$1 end
    shift
    end=$(($(date +%s%N) + limit * 1000000000))
    while [ "$(date +%s%N)" -lt "$end" ]; do
        "$@" >/dev/null 2>&1 && return 0
        sleep 0.1
    done
    return 1
}

ms_since() { echo $((($(date +%s%N) - $1) / 1000000)); }
