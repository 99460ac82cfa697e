#!/usr/bin/env bash
# The shared cache as two machines see it, at 1 GiB (issue 34): the source store far away
# (20 ms added latency, 50 MB/s), the shared cache on a second, near MinIO.
#   bench/shared-cache/run.sh [SIZE]      (default 1GiB; needs target/release built)
# Both stores are MinIO on 127.0.0.1; FAR picks how the source store is made far:
#   FAR=tc         (the default as root with tc) the answers of the far store (TCP source port =
#                  its port) go through an htb class on lo at 400 Mbit/s = 50 MB/s for all
#                  connections together, the cap of one real link; the other traffic on lo is not
#                  classified and goes out directly, unshaped. The 20 ms come from toxiproxy (a
#                  latency toxic, no bandwidth toxic), which the clients go through: netem (and
#                  prio) would do both in the kernel, but this machine's kernel has neither
#                  (CONFIG_NET_SCH_NETEM, CONFIG_NET_SCH_PRIO unset, no modules). Refuses to start
#                  if lo already has a root qdisc; the exit trap deletes the one it added (also on
#                  an error or Ctrl-C). htb counts whole GSO packets, so the rate holds with GSO on.
#   FAR=toxiproxy  the old model: toxiproxy alone, 20 ms and 50 MiB/s, but its bandwidth toxic is
#                  per connection: a mount with N ranged GETs in flight gets N x 50 MiB/s.
# Both add the 20 ms to the answers only (20 ms each way was too much), not to the requests.
# The first line printed says which model is in force. CHECK=1 then measures the far link as the
# clients see it: a 16-way ranged GET of the object (about SIZE / 50 MB/s with FAR=tc) and
# three 1-byte GETs (20 ms and a little more each), then the same from the far store itself,
# without toxiproxy (with FAR=tc: the cap, not the 20 ms).
# Prints, page cache dropped before each read:
#   uncached   a mount without --shared-cache reads the object from the far source (today)
#   cache only a mount with --cache alone reads it from the far source (what the local
#              cache costs the first read)
#   first      machine 1 (--cache + --shared-cache) reads it from the source, fills the tier
#   second     machine 2 (its own empty --cache) reads it: from the shared cache
#   direct     s3direct GET of the same bytes from the near store: the shared cache's own
#              objects (16 at once), and a copy of the object (one streamed GET and 16-way
#              ranged GETs)
#   near mount the same bytes read through a mount of the near store itself, without a cache
#              and with a --cache of its own (as machine 2 has):
#              bucketfs, and geesefs (the fastest peer on big reads; $GEESEFS, default
#              ~/.cache/bucketfs-deps/bin/geesefs, skipped if absent): what a FUSE mount
#              costs on top of the direct read, on this machine
# and the GETs of the object machine 2 sent to the source (from its request log).
# RUNS=N (default 2) repeats machine 2 and the near store's readers, in turn.
# PROFILE=1 records machine 2's daemon with perf (perf.data at the top of the repository);
# PROFILE=all records the whole machine.
set -euo pipefail
cd "$(dirname "$0")/../.."
SIZE=${1:-1GiB}
die() { echo "run.sh: $*" >&2; exit 1; }
if [ -z "${FAR:-}" ]; then
    if [ "$(id -u)" = 0 ] && command -v tc >/dev/null; then FAR=tc; else FAR=toxiproxy; fi
fi
case "$FAR" in
    tc)
        [ "$(id -u)" = 0 ] || die "FAR=tc needs root (tc on lo); FAR=toxiproxy does not"
        command -v tc >/dev/null || die "FAR=tc needs tc (iproute2); FAR=toxiproxy does not"
        lo_root=$(tc qdisc show dev lo root)
        case "$lo_root" in
            "qdisc noqueue 0: root"*) ;;
            *) die "lo already has a root qdisc, not this script's: ${lo_root%% refcnt*}. Someone else's traffic control: not touching it (if it is a stale one of this script: tc qdisc del dev lo root), or run with FAR=toxiproxy" ;;
        esac ;;
    toxiproxy) ;;
    *) die "FAR is tc or toxiproxy, not $FAR" ;;
esac
BIN=${BUCKETFS_DEPS_DIR:-$HOME/.cache/bucketfs-deps}/bin
unset AWS_CA_BUNDLE AWS_PROFILE AWS_DEFAULT_PROFILE AWS_ENDPOINT_URL
W=$(mktemp -d /var/tmp/shared-bench.XXXXXX)
pids=()
TC_ADDED=
cleanup() {
    if [ -n "$TC_ADDED" ]; then
        tc qdisc del dev lo root || echo "run.sh: could not delete the qdisc on lo: tc qdisc del dev lo root" >&2
    fi
    for m in "$W"/mnt-*; do
        if mountpoint -q "$m" 2>/dev/null; then target/release/bucketfs unmount "$m" || true; fi
    done
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    [ -z "${FAR_PID:-}" ] || scripts/stop-store "$FAR_PID" "$FAR_DIR" || true
    [ -z "${NEAR_PID:-}" ] || scripts/stop-store "$NEAR_PID" "$NEAR_DIR" || true
    rm -rf "$W"
}
trap cleanup EXIT
# Ctrl-C, kill, a closed terminal: out through exit and the EXIT trap, so the qdisc on lo never
# stays (bash 5 runs the EXIT trap on these signals anyway; this does not depend on it).
trap 'exit 130' INT; trap 'exit 143' TERM; trap 'exit 129' HUP
store() { (set -a; eval "$(scripts/start-store minio --dir "$W/$1")"; echo "$STORE_PID $STORE_DIR $STORE_ENDPOINT $AWS_ACCESS_KEY_ID $AWS_SECRET_ACCESS_KEY"); }
read -r FAR_PID FAR_DIR FAR_URL KEY SECRET < <(store far)
read -r NEAR_PID NEAR_DIR NEAR_URL _ _ < <(store near)
export AWS_ACCESS_KEY_ID=$KEY AWS_SECRET_ACCESS_KEY=$SECRET AWS_EC2_METADATA_DISABLED=true
s3() { AWS_ENDPOINT_URL=$1 target/release/examples/s3direct "${@:2}"; }
s3 "$FAR_URL" mb data >/dev/null; s3 "$FAR_URL" put-gen data big.bin --size "$SIZE" >/dev/null
s3 "$NEAR_URL" mb cache >/dev/null; s3 "$NEAR_URL" mb direct >/dev/null
s3 "$NEAR_URL" put-gen direct big.bin --size "$SIZE" >/dev/null

FAR_PORT=${FAR_URL##*:}
if [ "$FAR" = tc ]; then
    # htb, default 0: packets no filter classifies go out directly, as without a qdisc.
    tc qdisc add dev lo root handle 1: htb || die "could not add an htb qdisc on lo (run with FAR=toxiproxy)"
    TC_ADDED=1
    tc class add dev lo parent 1: classid 1:1 htb rate 400mbit quantum 65536
    tc filter add dev lo parent 1: protocol ip prio 1 u32 \
        match ip protocol 6 0xff match ip sport "$FAR_PORT" 0xffff flowid 1:1
    echo "far store: FAR=tc: answers from 127.0.0.1:$FAR_PORT capped at 400 Mbit/s (50 MB/s) for all connections together (tc htb on lo), +20 ms on answers (toxiproxy)"
else
    echo "far store: FAR=toxiproxy: +20 ms on answers and 50 MiB/s per connection (toxiproxy), no cap on all connections together"
fi

# toxiproxy in front of the far store: 20 ms each way is too much; 20 ms on answers.
TP_API=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$BIN/toxiproxy-server" -host 127.0.0.1 -port "$TP_API" > "$W/toxiproxy.log" 2>&1 & pids+=($!)
for _ in $(seq 50); do curl -s "http://127.0.0.1:$TP_API/version" >/dev/null && break; sleep 0.1; done
api() { curl -sf -X POST "http://127.0.0.1:$TP_API$1" -d "$2" >/dev/null; }
api /proxies "{\"name\":\"far\",\"listen\":\"127.0.0.1:0\",\"upstream\":\"${FAR_URL#http://}\"}"
PROXY=http://$(curl -s "http://127.0.0.1:$TP_API/proxies/far" | python3 -c 'import sys,json; print(json.load(sys.stdin)["listen"])')
api /proxies/far/toxics '{"name":"latency","type":"latency","stream":"downstream","attributes":{"latency":20}}'
[ "$FAR" = tc ] || api /proxies/far/toxics '{"name":"bandwidth","type":"bandwidth","stream":"downstream","attributes":{"rate":51200}}'
if [ -n "${CHECK:-}" ]; then
    printf '0\n1\n2\n' > "$W/offsets"
    echo "far, direct (ranged):        $(s3 "$PROXY" get data big.bin --concurrency 16 2>&1 | tail -1)"
    echo "far, 1-byte GETs:            $(s3 "$PROXY" get-ranges data big.bin --offsets "$W/offsets" --len 1 2>&1 | tail -1)"
    echo "far store itself, no proxy:  $(s3 "$FAR_URL" get data big.bin --concurrency 16 2>&1 | tail -1)"
    echo "far store itself, 1-byte:    $(s3 "$FAR_URL" get-ranges data big.bin --offsets "$W/offsets" --len 1 2>&1 | tail -1)"
fi

mountit() { # NAME ARGS...
    local m="$W/mnt-$1"; mkdir -p "$m"; shift
    target/release/bucketfs mount --endpoint-url "$PROXY" --force-path-style --log-file "$W/$(basename "$m").log" "$@" s3://data "$m" >/dev/null
    echo "$m"
}
timed_read() { sync; echo 3 > /proc/sys/vm/drop_caches; local t0 t1; t0=$(date +%s.%N); cat "$1" > /dev/null; t1=$(date +%s.%N); python3 -c "print(f'{$t1-$t0:.2f}')"; }
head -c 32 /dev/urandom > "$W/tier.key"
SHARED=(--shared-cache s3://cache/blocks --shared-cache-endpoint-url "$NEAR_URL" --shared-cache-key-file "$W/tier.key")

m=$(mountit uncached); echo "uncached: $(timed_read "$m/big.bin") s"; target/release/bucketfs unmount "$m"
m=$(mountit cacheonly --cache "$W/cache0"); echo "cache only: $(timed_read "$m/big.bin") s"; target/release/bucketfs unmount "$m"
m=$(mountit first --cache "$W/cache1" "${SHARED[@]}"); echo "first:    $(timed_read "$m/big.bin") s"
# The unmount waits for the blocks queued for the shared cache (at most 30 s).
target/release/bucketfs unmount "$m"
grep -h "shared cache:" "$W/mnt-first.log" | head -3 || true
echo "blocks in the shared cache: $(s3 "$NEAR_URL" list cache blocks/ | head -1)"
# The near store's readers, RUNS times (default 2) in turn, each machine 2 with an empty
# local cache: one run on this machine varies by 10-20%.
for run in $(seq "${RUNS:-2}"); do
    rm -rf "$W/cache2"
    m=$(mountit second --cache "$W/cache2" "${SHARED[@]}" --log-level bucketfs::store=debug)
    if [ -n "${PROFILE:-}" ] && [ "$run" = 1 ]; then
        target=(-p "$(pgrep -f "mnt-second" | head -1)")
        [ "$PROFILE" != all ] || target=(-a)
        perf record -F 999 -g -o perf.data "${target[@]}" > "$W/perf.log" 2>&1 & PERF=$!
        sleep 0.5
    fi
    echo "second:   $(timed_read "$m/big.bin") s"
    if [ -n "${PROFILE:-}" ] && [ "$run" = 1 ]; then kill -INT "$PERF"; wait "$PERF" || true; fi
    target/release/bucketfs unmount "$m"
    echo "second machine's GETs of big.bin from the source: $(grep -cE 's3 GET bucket=data key="?big\.bin' "$W/mnt-second.log" || true)"
    sync; echo 3 > /proc/sys/vm/drop_caches
    echo "direct (near, the shared cache's objects, 16 at once): $(s3 "$NEAR_URL" get-prefix cache blocks/ --concurrency 16 2>&1 | tail -1)"
    sync; echo 3 > /proc/sys/vm/drop_caches
    echo "direct (near, one GET): $(s3 "$NEAR_URL" get direct big.bin 2>&1 | tail -1)"
    echo "direct (near, ranged):  $(s3 "$NEAR_URL" get direct big.bin --concurrency 16 2>&1 | tail -1)"
    m="$W/mnt-near"; mkdir -p "$m"
    target/release/bucketfs mount --endpoint-url "$NEAR_URL" --force-path-style --log-file "$W/mnt-near.log" s3://direct "$m" >/dev/null
    echo "near mount, bucketfs: $(timed_read "$m/big.bin") s"; target/release/bucketfs unmount "$m"
    # The same with a local cache of its own, as machine 2 has: what filling it costs.
    rm -rf "$W/cache3"; m="$W/mnt-nearc"; mkdir -p "$m"
    target/release/bucketfs mount --endpoint-url "$NEAR_URL" --force-path-style --log-file "$W/mnt-nearc.log" \
        --cache "$W/cache3" s3://direct "$m" >/dev/null
    echo "near mount, bucketfs --cache: $(timed_read "$m/big.bin") s"; target/release/bucketfs unmount "$m"
    GEESEFS=${GEESEFS:-$BIN/geesefs}
    if [ -x "$GEESEFS" ]; then
        m="$W/mnt-geesefs"; mkdir -p "$m"
        "$GEESEFS" -f --endpoint "$NEAR_URL" --region us-east-1 direct "$m" > "$W/geesefs.log" 2>&1 & pids+=($!)
        for _ in $(seq 100); do mountpoint -q "$m" && break; sleep 0.1; done
        echo "near mount, geesefs:  $(timed_read "$m/big.bin") s"; fusermount3 -u "$m"
    else
        echo "near mount, geesefs:  not measured ($GEESEFS not found)"
    fi
done
