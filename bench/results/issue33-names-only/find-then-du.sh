#!/usr/bin/env bash
# find-then-du.sh TREE: a names-only walk, then a stat walk of the same tree; prints the du's time.
find "$1" -name '*.h' >/dev/null
s=$(date +%s%N); du -s "$1" >/dev/null; e=$(date +%s%N); echo "du after find: $(( (e - s) / 1000 )) us" >&2
