#!/usr/bin/env bash
# Jobs that outlive one call on the lent GPU (a call stops at 10 minutes; the machine stays
# warm while calls follow each other). From the repository root, after gpu_device.sh:
#   bash dev/gpu/bg.sh start NAME command...   # start NAME in its own session unless it runs
#   bash dev/gpu/bg.sh wait SECONDS [FILE...]  # until every job ended or SECONDS passed; then
#                                              # the logs' tails, and FILEs copied to $OUT
# Logs and pids: runs/bg/NAME.{log,pid}; a job's exit status: runs/bg/NAME.rc.
set -uo pipefail
BG=runs/bg
mkdir -p $BG
running() { [ -f "$BG/$1.pid" ] && kill -0 "$(cat "$BG/$1.pid")" 2>/dev/null; }
case "${1:-}" in
  start)
    name=$2; shift 2
    if running "$name"; then echo "bg: $name still running"; exit 0; fi
    rm -f "$BG/$name.rc"
    setsid nohup bash -c '"$@"; echo $? > '"$BG/$name.rc" _ "$@" > "$BG/$name.log" 2>&1 < /dev/null &
    echo $! > "$BG/$name.pid"
    echo "bg: started $name (pid $!)";;
  wait)
    secs=$2; shift 2
    end=$((SECONDS + secs))
    while [ $SECONDS -lt $end ]; do
      busy=0
      for p in $BG/*.pid; do [ -e "$p" ] && running "$(basename "$p" .pid)" && busy=1; done
      [ $busy = 0 ] && break
      sleep 5
    done
    for p in $BG/*.pid; do
      [ -e "$p" ] || continue
      n=$(basename "$p" .pid)
      state=$(running "$n" && echo running || echo "exit $(cat "$BG/$n.rc" 2>/dev/null || echo '?')")
      echo "== $n: $state"; tail -n 15 "$BG/$n.log"
    done
    if [ -n "${OUT:-}" ]; then
      for f in "$@"; do [ -e "$f" ] && cp -r "$f" "$OUT/"; done
      cp $BG/*.log "$OUT/" 2>/dev/null
    fi;;
  *) echo "usage: bg.sh start NAME command... | wait SECONDS [FILE...]" >&2; exit 2;;
esac
