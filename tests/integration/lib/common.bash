# Sourced by integration tests: skips, failures, and booted systemd-nspawn containers.
# shellcheck shell=bash

# Debian's tools first: a python3 elsewhere on PATH lacks python3-apt and friends.
export PATH=/usr/sbin:/usr/bin:/sbin:/bin${PATH:+:$PATH}

skip() { echo "SKIP: $*" >&2; exit 77; }
fail() { echo "FAIL: $*" >&2; exit 1; }
ok() { echo "ok: $*"; }
# has GREP-ARGS...: 'grep -q' that drains its input, so that under pipefail the
# command writing into the pipe never dies of SIGPIPE when the match comes early.
has() {
    local rc=0
    grep -q "$@" || rc=$?
    cat > /dev/null
    return "$rc"
}

require_root() { [ "$(id -u)" = 0 ] || skip "needs root"; }
# require_nspawn, require_qemu BIN [MB]: skip, with the tool's own message, where no
# container can be started (inside another container, nested nspawn usually fails) or
# qemu cannot start a machine of MB (1024) here; tests/integration/lib/can-run tries it.
# Only "cannot run here" skips: a probe that runs is no excuse for a later failure.
CAN_RUN="$(dirname "${BASH_SOURCE[0]}")/can-run"
require_nspawn() { _require_can_run nspawn; }
require_qemu() { _require_can_run qemu "$@"; }
_require_can_run() {
    local out rc=0
    out=$("$CAN_RUN" "$@") || rc=$?
    case $rc in
        0) ;;
        77) skip "$out" ;;
        *) fail "can-run $*: exit $rc: $out" ;;
    esac
}
require_cmd() {
    local c
    for c in "$@"; do command -v "$c" >/dev/null || skip "$c is not installed"; done
}

# The .debs built by 'make build' (DEBADMIN_DEBS, set by tests/integration/run).
debs_dir() {
    local dir=${DEBADMIN_DEBS:-}
    if [ -z "$dir" ] || ! ls "$dir"/python3-debadmin_*.deb >/dev/null 2>&1; then
        skip "no built packages in '${dir:-DEBADMIN_DEBS unset}': run 'make build' first"
    fi
    echo "$dir"
}

# mirror_for RELEASE: the archive the host's apt uses (deb.debian.org by default).
mirror_for() {
    local uri
    uri=$(sed -n 's/^URIs: *\([^ ]*debian\)\/\?$/\1/p' /etc/apt/sources.list.d/*.sources 2>/dev/null | head -n1)
    echo "${uri:-http://deb.debian.org/debian}"
}

# ct_make_root RELEASE DIR PKG,PKG [mmdebstrap options...]: a bootable tree.
# Within one tests/integration/run (which sets DEBADMIN_CT_CACHE and removes it at the
# end) a base tree per release is made once and copied; PKG,PKG are installed into the
# copy with apt-get, and --customize-hook options run on it as mmdebstrap runs them
# ('sh -c HOOK exec DIR'). Other mmdebstrap options, or no cache: a plain mmdebstrap.
CT_BASE_PKGS=systemd,systemd-sysv,dbus,python3,python3-apt
# mmdebstrap empties /etc/machine-id after the hooks: systemd makes one at each boot.
# shellcheck disable=SC2016 # $1 is the tree, given by mmdebstrap or ct_make_root
CT_IDENTITY_HOOK='echo debadmin-test > "$1/etc/hostname"'
ct_make_root() {
    local release=$1 dir=$2 pkgs=$3 cache=${DEBADMIN_CT_CACHE:-} opt start=$SECONDS
    # Every tree made here is booted: find out before spending minutes on mmdebstrap.
    require_nspawn
    local hooks=("$CT_IDENTITY_HOOK")
    shift 3
    for opt in "$@"; do
        case $opt in
            --customize-hook=*) hooks+=("${opt#--customize-hook=}") ;;
            *) cache="" ;;
        esac
    done
    if [ -z "$cache" ] || [ ! -d "$cache" ]; then
        mmdebstrap --quiet --variant=minbase --include="$CT_BASE_PKGS,$pkgs" \
            --customize-hook="$CT_IDENTITY_HOOK" "$@" \
            "$release" "$dir" "$(mirror_for "$release")" || fail "mmdebstrap $release failed"
        echo "ct_make_root: $release tree by mmdebstrap in $((SECONDS - start)) s"
        return 0
    fi
    (
        flock 9
        [ -d "$cache/$release" ] && exit 0
        rm -rf "$cache/$release.new"
        # Package lists kept: the copies install their packages from them.
        mmdebstrap --quiet --variant=minbase --include="$CT_BASE_PKGS" --skip=cleanup/apt/lists \
            "$release" "$cache/$release.new" "$(mirror_for "$release")" &&
            mv "$cache/$release.new" "$cache/$release"
    ) 9>"$cache/$release.lock" || fail "mmdebstrap $release failed (base tree)"
    mkdir -p "$dir"
    cp -a --reflink=auto "$cache/$release/." "$dir/" || fail "copying the $release base tree"
    # A private mount namespace: /dev and /proc for the maintainer scripts, gone with it.
    # shellcheck disable=SC2016 # expanded by that sh
    unshare --mount --propagation private --fork sh -euc '
        dir=$1 pkgs=$2
        shift 2
        mount --rbind /dev "$dir/dev"
        mount -t proc proc "$dir/proc"
        # The comma-separated list made into words.
        chroot "$dir" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LC_ALL=C.UTF-8 \
            DEBIAN_FRONTEND=noninteractive apt-get -q -y -o Dpkg::Use-Pty=0 \
            --no-install-recommends install $(echo "$pkgs" | tr , " ") > "$dir/.ct-apt.log" 2>&1 ||
            { tail -n 30 "$dir/.ct-apt.log"; exit 1; }
        rm -f "$dir/.ct-apt.log"
        for hook in "$@"; do sh -c "$hook" exec "$dir"; done
        # Then clean up as mmdebstrap does: no package lists, apt cache, logs, machine-id.
        chroot "$dir" apt-get clean
        find "$dir/var/lib/apt/lists" -mindepth 1 -maxdepth 1 ! -name lock ! -name partial \
            -exec rm -rf {} +
        for f in log/dpkg.log log/apt/history.log log/apt/term.log log/alternatives.log \
            cache/ldconfig/aux-cache log/apt/eipp.log.xz lib/dbus/machine-id cache/debconf/tmp.ci; do
            rm -rf "$dir/var/$f"
        done
        : > "$dir/etc/machine-id"
    ' sh "$dir" "$pkgs" "${hooks[@]}" || fail "installing $pkgs into the $release tree"
    echo "ct_make_root: $release tree from the cached base in $((SECONDS - start)) s"
}

CT_PID=""
CT_NSPAWN_PID=""
CT_LOG=""

# ct_boot DIR LOG [nspawn options...]: boot DIR, wait until systemd is up.
ct_boot() {
    local dir=$1 state
    require_nspawn
    CT_LOG=$2
    shift 2
    systemd-nspawn -D "$dir" --boot --register=no --keep-unit --console=read-only \
        --link-journal=no "$@" >"$CT_LOG" 2>&1 &
    CT_NSPAWN_PID=$!
    for _ in $(seq 1 120); do
        CT_PID=$(ct_init_pid "$CT_NSPAWN_PID")
        [ -n "$CT_PID" ] && break
        sleep 0.5
    done
    [ -n "$CT_PID" ] || { tail -n 30 "$CT_LOG"; fail "container did not start"; }
    for _ in $(seq 1 120); do
        state=$(ct systemctl is-system-running 2>/dev/null || true)
        case $state in running|degraded) return 0 ;; esac
        sleep 0.5
    done
    tail -n 30 "$CT_LOG"
    fail "container did not finish booting (state: $state)"
}

# ct_init_pid NSPAWN_PID: the container's init, the descendant that is PID 1 in its
# own PID namespace (nspawn's direct child is a short-lived helper).
ct_init_pid() {
    local p
    for p in $(pgrep -P "$1") $(pgrep -P "$(pgrep -d, -P "$1")" 2>/dev/null); do
        if [ "$(awk '/^NSpid:/ {print $NF}' "/proc/$p/status" 2>/dev/null)" = 1 ] &&
            [ "$(cat "/proc/$p/comm" 2>/dev/null)" = systemd ]; then
            echo "$p"
            return 0
        fi
    done
}

# ct CMD...: run a command inside the booted container.
ct() { nsenter --target "$CT_PID" --all --wdns=/ -- env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LC_ALL=C.UTF-8 "$@"; }

ct_stop() {
    [ -n "$CT_NSPAWN_PID" ] || return 0
    # SIGRTMIN+4 asks systemd for a clean poweroff; nspawn exits when it is done.
    if [ -n "$CT_PID" ]; then kill -s RTMIN+4 "$CT_PID" 2>/dev/null || true; fi
    for _ in $(seq 1 60); do
        kill -0 "$CT_NSPAWN_PID" 2>/dev/null || break
        sleep 0.5
    done
    kill -KILL "$CT_NSPAWN_PID" 2>/dev/null || true
    wait "$CT_NSPAWN_PID" 2>/dev/null || true
    CT_NSPAWN_PID="" CT_PID=""
}

# ct_debs DEBS_DIR PKG...: the in-container paths (/debs/...) of the built PKG .debs,
# for a container booted with --bind-ro=DEBS_DIR:/debs.
ct_debs() {
    local dir=$1 pkg f
    shift
    for pkg in "$@"; do
        f=$(find "$dir" -maxdepth 1 -name "${pkg}_*_all.deb" | sort | head -n1)
        [ -n "$f" ] || fail "no built package $pkg in $dir"
        echo "/debs/$(basename "$f")"
    done
}

# ct_assert_exposure UNIT [MAX]: systemd-analyze security of UNIT in the booted container
# (that release's systemd and its weights) is MAX (6.0) or lower; prints the figure.
ct_assert_exposure() {
    local unit=$1 max=${2:-6.0} out level release
    out=$(ct systemd-analyze security --no-pager "$unit" 2>&1) ||
        fail "systemd-analyze security $unit: $(tail -n 1 <<<"$out")"
    level=$(sed -n 's/^.*Overall exposure level for [^:]*: \([0-9.]*\) .*/\1/p' <<<"$out")
    [ -n "$level" ] || fail "systemd-analyze security $unit: no exposure level in: $(tail -n 1 <<<"$out")"
    release=$(ct sed -n 's/^VERSION_CODENAME=//p' /etc/os-release)
    awk -v l="$level" -v m="$max" 'BEGIN { exit !(l <= m) }' ||
        fail "$release: $unit exposure $level is above $max"
    ok "$release: $unit exposure $level (at most $max, systemd $(ct systemctl --version | awk 'NR==1 {print $2}'))"
}

# ct_node_metrics FILE: node_exporter's /metrics, as the booted container's
# prometheus-node-exporter serves it on its own 127.0.0.1:9100 (boot the container
# with --private-network: the port stays in it), into FILE; waits for the service.
ct_node_metrics() {
    local url=http://127.0.0.1:9100/metrics
    for _ in $(seq 1 60); do
        ct python3 -c "import sys, urllib.request; sys.stdout.write(urllib.request.urlopen('$url', timeout=10).read().decode())" \
            >"$1" 2>/dev/null && return 0
        sleep 0.5
    done
    fail "node_exporter serves no $url"
}

# check_debadmin_metrics FILE TOOL:COMMAND:STATUS...: debadmin(7)'s metric shape in it.
check_debadmin_metrics() {
    python3 "$(dirname "${BASH_SOURCE[0]}")/check-debadmin-metrics" "$@"
}
