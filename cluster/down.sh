#!/usr/bin/env bash
# Stops what cluster/up.sh STATE_DIR started (jobs cancelled first); the folder stays for its logs.
STATE=$(realpath -m "${1:?usage: cluster/down.sh STATE_DIR}")
export SLURM_CONF="$STATE/slurm/slurm.conf"
[ -f "$SLURM_CONF" ] && scancel --full -u "$(id -un)" 2>/dev/null
for pid in "$STATE/mlflow.pid" "$STATE/slurm/slurmd.pid" "$STATE/slurm/slurmctld.pid" "$STATE/munge/munged.pid"; do
  [ -f "$pid" ] && kill -- "-$(cat "$pid")" 2>/dev/null || { [ -f "$pid" ] && kill "$(cat "$pid")" 2>/dev/null; }
done
PGBIN=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)
[ -d "$STATE/pg/data" ] && runuser -u postgres -- "$PGBIN/pg_ctl" -D "$STATE/pg/data" -m fast -w stop >/dev/null 2>&1
echo "cluster: down ($STATE)"
exit 0
