#!/bin/bash
# Reproduce all figures in REPORT.md. Needs root, /dev/fuse, Linux 6.14+ with CONFIG_FUSE_IO_URING.
# Sets /sys/module/fuse/parameters/enable_uring=Y for each bench and restores it afterwards.
set -e
cd "$(dirname "$0")"
cargo build --release -q
B=./target/release/uring-spike
mkdir -p results
run() { name=$1; shift; echo "=== $name: $*"; "$@" 2>results/$name.log | tee results/$name.txt; }
run A-default          $B bench --runs 3 --files 1000 --stat-iters 20 --reads 100000
run B-client-pinned    $B bench --runs 3 --pin-client 0
run C-dev1thr          $B bench --runs 3 --dev-threads 1
run D-dev1thr-pinned   $B bench --runs 3 --dev-threads 1 --pin-client 0
run E-dev-pinned-thr   $B bench --runs 3 --dev-pin
SPIKE_TASKRUN=defer run F-uring-defer-taskrun $B bench --runs 3
SPIKE_TASKRUN=none  run G-uring-no-taskrun-flag $B bench --runs 3
echo "=== experiments"
$B probe-disabled 2>&1 | tee results/probe-disabled.txt
$B experiment --register-before-init 2>&1 | tee results/register-before-init.txt
$B experiment --no-uring-flag 2>&1 | tee results/no-uring-flag.txt
echo "enable_uring now: $(cat /sys/module/fuse/parameters/enable_uring)"; grep -c uring-spike /proc/mounts || true
