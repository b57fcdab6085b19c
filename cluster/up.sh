#!/usr/bin/env bash
# A single-node SLURM cluster and an MLflow server on PostgreSQL, on 127.0.0.1, with all state in one folder:
#   cluster/up.sh STATE_DIR        (as root; then: source STATE_DIR/env.sh)
# Installs what is missing (Debian: slurm-wlm, munge, postgresql; pip: the repo's [cluster] extra), then starts
# munged, slurmctld, slurmd, PostgreSQL and `mlflow server`, each with its files under STATE_DIR, and writes
# STATE_DIR/env.sh (SLURM_CONF, SPECLAB_TRACKING_URI). cluster/down.sh STATE_DIR stops them all.
set -euo pipefail
STATE=$(realpath -m "${1:?usage: cluster/up.sh STATE_DIR}")
REPO=$(cd "$(dirname "$0")/.." && pwd)
PY="$REPO/.venv/bin/python"
SLURM_PORT=${SLURM_PORT:-16817}
PG_PORT=${PG_PORT:-15432}
MLFLOW_PORT=${MLFLOW_PORT:-15055}
say() { echo "cluster: $*"; }
die() { echo "cluster: error: $*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || die "needs root (it installs Debian packages and runs slurmd); run it as root or use +launcher=submitit_local"
[ -x "$PY" ] || die "$PY is missing: run make setup first"
command -v apt-get >/dev/null || die "apt-get not found: install slurm-wlm, munge and postgresql with your package manager"

missing=()
for cmd in slurmctld:slurmctld slurmd:slurmd sinfo:slurm-client munged:munge pg_ctlcluster:postgresql; do
  command -v "${cmd%%:*}" >/dev/null || missing+=("${cmd##*:}")
done
if [ ${#missing[@]} -gt 0 ]; then
  say "installing ${missing[*]} (apt-get)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -q --no-install-recommends slurm-wlm munge postgresql >"$STATE.apt.log" 2>&1 \
    || { apt-get update -q >>"$STATE.apt.log" 2>&1 && apt-get install -y -q --no-install-recommends slurm-wlm munge postgresql \
         >>"$STATE.apt.log" 2>&1; } || die "apt-get could not install slurm-wlm munge postgresql (see $STATE.apt.log)"
fi
"$PY" -c "import hydra_plugins.hydra_submitit_launcher, psycopg2" 2>/dev/null \
  || { say "installing the [cluster] extra (pip)"; "$REPO/.venv/bin/pip" install -q -e "$REPO[cluster]" >/dev/null \
       || die "pip could not install the [cluster] extra (hydra-submitit-launcher, psycopg2-binary)"; }

mkdir -p "$STATE"/{munge,slurm/state,slurm/spool,slurm/log,pg,artifacts,outputs}
chmod 755 "$STATE"  # the postgres user must reach its data folder
chmod 700 "$STATE/munge"

# munge: a fresh key and a socket of our own
[ -f "$STATE/munge/munge.key" ] || mungekey -c -k "$STATE/munge/munge.key" -f >/dev/null
chmod 400 "$STATE/munge/munge.key"
munged --key-file="$STATE/munge/munge.key" --socket="$STATE/munge/munge.sock" --pid-file="$STATE/munge/munged.pid" \
  --log-file="$STATE/munge/munged.log" --seed-file="$STATE/munge/seed" -f
munge -S "$STATE/munge/munge.sock" -n | unmunge -S "$STATE/munge/munge.sock" >/dev/null || die "munge does not work (see $STATE/munge/munged.log)"

# SLURM: this host as the only node, its CPUs and most of its memory
HOST=$(hostname -s)
CPUS=$(nproc)
MEM_MB=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 * 3 / 4 ))
sed -e "s|@STATE@|$STATE|g" -e "s|@HOST@|$HOST|g" -e "s|@CPUS@|$CPUS|g" -e "s|@MEM_MB@|$MEM_MB|g" \
    -e "s|@PORT@|$SLURM_PORT|g" -e "s|@PORT2@|$((SLURM_PORT + 1))|g" "$REPO/cluster/slurm.conf.in" >"$STATE/slurm/slurm.conf"
export SLURM_CONF="$STATE/slurm/slurm.conf"
slurmctld -f "$SLURM_CONF"
slurmd -f "$SLURM_CONF"
for _ in $(seq 1 30); do
  sinfo -h -o %T 2>/dev/null | grep -q idle && break
  sleep 1
done
sinfo -h -o %T | grep -q idle || die "the SLURM node did not come up (see $STATE/slurm/log)"

# PostgreSQL: a throwaway cluster owned by the postgres user, trust on 127.0.0.1 only
PGBIN=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)
chown postgres "$STATE/pg"
runuser -u postgres -- "$PGBIN/initdb" -D "$STATE/pg/data" -U speclab --auth=trust >"$STATE/pg/initdb.log" 2>&1 \
  || die "initdb failed (see $STATE/pg/initdb.log)"
runuser -u postgres -- "$PGBIN/pg_ctl" -D "$STATE/pg/data" -l "$STATE/pg/pg.log" -w \
  -o "-h 127.0.0.1 -p $PG_PORT -k $STATE/pg" start >/dev/null || die "PostgreSQL did not start (see $STATE/pg/pg.log)"
psql -q -h 127.0.0.1 -p "$PG_PORT" -U speclab -d postgres -c "create database mlflow" >/dev/null

# MLflow: runs in PostgreSQL, artifacts on the shared folder
# In a session of its own, its pid written by itself: down.sh stops the server and its workers as one group.
(cd "$STATE" && MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false setsid bash -c 'echo $$ >mlflow.pid; exec "$0" server \
   --backend-store-uri "$1" --default-artifact-root "$2" --host 127.0.0.1 --port "$3" --workers 1' \
   "$REPO/.venv/bin/mlflow" "postgresql+psycopg2://speclab@127.0.0.1:$PG_PORT/mlflow" "$STATE/artifacts" \
   "$MLFLOW_PORT" >"$STATE/mlflow.log" 2>&1 &)
for _ in $(seq 1 60); do
  curl -sf "http://127.0.0.1:$MLFLOW_PORT/health" >/dev/null && break
  sleep 1
done
curl -sf "http://127.0.0.1:$MLFLOW_PORT/health" >/dev/null || die "mlflow server did not answer (see $STATE/mlflow.log)"

cat >"$STATE/env.sh" <<ENV
export SLURM_CONF=$SLURM_CONF
export SPECLAB_TRACKING_URI=http://127.0.0.1:$MLFLOW_PORT
export SPECLAB_SHARED=$STATE/outputs
ENV
say "up: SLURM partition debug ($CPUS CPUs), MLflow http://127.0.0.1:$MLFLOW_PORT on PostgreSQL :$PG_PORT; source $STATE/env.sh"
