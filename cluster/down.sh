#!/usr/bin/env bash
# Stops what cluster/up.sh STATE_DIR started (jobs cancelled first) and waits until every daemon has exited
# (SIGKILL after 15 s); the folder stays for its logs. Safe to run on a half-started or already stopped cluster.
STATE=$(realpath -m "${1:?usage: cluster/down.sh STATE_DIR}")
export SLURM_CONF="$STATE/slurm/slurm.conf"
[ -f "$SLURM_CONF" ] && timeout 20 scancel --full -u "$(id -un)" 2>/dev/null
# running PID NAME: PID is alive (not a zombie) and still the program its pid file names, not a reused pid
running() { [ "$(ps -o comm= -p "$1" 2>/dev/null)" = "$2" ] && [ "$(ps -o stat= -p "$1" | cut -c1)" != Z ]; }
pids=()
for entry in mlflow.pid:mlflow slurm/slurmd.pid:slurmd slurm/slurmctld.pid:slurmctld munge/munged.pid:munged; do
  pidfile="$STATE/${entry%%:*}"
  [ -s "$pidfile" ] || continue
  pid=$(cat "$pidfile")
  running "$pid" "${entry##*:}" || continue
  pids+=("$pid:${entry##*:}")
  kill -- "-$pid" 2>/dev/null || kill "$pid" 2>/dev/null  # mlflow: the server and its workers, one group
done
PGBIN=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)
[ -f "$STATE/pg/data/postmaster.pid" ] && runuser -u postgres -- "$PGBIN/pg_ctl" -D "$STATE/pg/data" -m fast -w -t 30 \
  stop >/dev/null 2>&1
for _ in $(seq 1 15); do
  alive=()
  for entry in "${pids[@]}"; do running "${entry%%:*}" "${entry##*:}" && alive+=("${entry%%:*}"); done
  [ ${#alive[@]} -eq 0 ] && break
  sleep 1
done
for pid in "${alive[@]+"${alive[@]}"}"; do kill -9 -- "-$pid" 2>/dev/null || kill -9 "$pid" 2>/dev/null; done
[ -f "$STATE/pg/data/postmaster.pid" ] && runuser -u postgres -- "$PGBIN/pg_ctl" -D "$STATE/pg/data" -m immediate -w \
  stop >/dev/null 2>&1
echo "cluster: down ($STATE)"
exit 0
