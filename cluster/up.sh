#!/usr/bin/env bash
# A single-node SLURM cluster and an MLflow server on PostgreSQL, on 127.0.0.1, with all state in one folder:
#   cluster/up.sh STATE_DIR        (as root; then: source STATE_DIR/env.sh)
# Installs what is missing (Debian: slurm-wlm, munge, postgresql; pip: the repo's [cluster] extra), then starts
# munged, slurmctld, slurmd, PostgreSQL and `mlflow server`, each with its files under STATE_DIR, and writes
# STATE_DIR/env.sh (SLURM_CONF, SPECLAB_TRACKING_URI, MLflow's login). cluster/down.sh STATE_DIR stops them all;
# so does a failure here.
# Only the owner (the user who ran it) can use the cluster: every daemon listens on 127.0.0.1 alone, the munge
# socket sits in a folder only the owner enters, PostgreSQL asks every connection for a password (SCRAM) and
# the MLflow server every request (its basic-auth app: no permission without a login); the passwords are
# generated here into STATE_DIR/secrets (mode 600), never printed and never on a command line. MLflow's database
# belongs to a role that is no superuser.
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
"$PY" -c "import hydra_plugins.hydra_submitit_launcher, psycopg2, flask_wtf" 2>/dev/null \
  || { say "installing the [cluster] extra (pip)"; "$REPO/.venv/bin/pip" install -q -e "$REPO[cluster]" >/dev/null \
       || die "pip could not install the [cluster] extra (hydra-submitit-launcher, psycopg2-binary, Flask-WTF)"; }

# A folder that holds a cluster already is refused before anything starts (its down.sh would stop that one).
[ ! -e "$STATE/pg/data" ] && [ ! -e "$STATE/env.sh" ] \
  || die "$STATE holds a cluster already: cluster/down.sh it, or start a new one in an empty folder"
mkdir -p "$STATE"/{munge,secrets,slurm/state,slurm/spool,slurm/log,pg,mlflow-auth,artifacts,outputs}
trap '[ $? -eq 0 ] || "$REPO/cluster/down.sh" "$STATE" >/dev/null' EXIT  # a failed start leaves nothing running
trap 'exit 1' INT TERM
chmod 711 "$STATE"  # the postgres user must reach its data folder; nobody else lists what is here
chmod 700 "$STATE/munge" "$STATE/secrets" "$STATE/mlflow-auth" "$STATE/artifacts" "$STATE/outputs" "$STATE/slurm/state" \
  "$STATE/slurm/spool"

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

# PostgreSQL: a throwaway cluster owned by the postgres user on 127.0.0.1, a password (SCRAM) asked of every
# connection, local socket included. Two roles: speclab_admin (the bootstrap superuser, for setup and pg_dump)
# and speclab (no superuser: it owns MLflow's database and nothing else, so it cannot run programs).
# Each password is random, lives only in a pgpass file of the owner's (mode 600), and is held in a shell variable
# (printf is a builtin: no command line) while written; the server gets the role's SCRAM verifier, never the text.
umask 077
SECRETS="$STATE/secrets"
PGBIN=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)
chown postgres "$STATE/pg"
chmod 700 "$STATE/pg"  # data, socket and logs: the postgres user's alone
pw=$(openssl rand -hex 24)
printf '127.0.0.1:%s:*:speclab_admin:%s\n' "$PG_PORT" "$pw" >"$SECRETS/pg-admin.pgpass"
install -m 600 -o postgres /dev/null "$STATE/pg/initdb.pw"
printf '%s\n' "$pw" >"$STATE/pg/initdb.pw"
pw=$(openssl rand -hex 24)
printf '127.0.0.1:%s:mlflow:speclab:%s\n' "$PG_PORT" "$pw" >"$SECRETS/mlflow.pgpass"
unset pw
chmod 600 "$SECRETS"/*.pgpass
initdb_rc=0
runuser -u postgres -- "$PGBIN/initdb" -D "$STATE/pg/data" -U speclab_admin --auth=scram-sha-256 \
  --pwfile="$STATE/pg/initdb.pw" >"$STATE/pg/initdb.log" 2>&1 || initdb_rc=$?
rm -f "$STATE/pg/initdb.pw"
[ $initdb_rc -eq 0 ] || die "initdb failed (see $STATE/pg/initdb.log)"
cat >"$STATE/pg/data/pg_hba.conf" <<'HBA'
# TYPE  DATABASE  USER  ADDRESS       METHOD  (cluster/up.sh: a password for every connection, nothing else)
local   all       all                 scram-sha-256
host    all       all   127.0.0.1/32  scram-sha-256
HBA
chown postgres "$STATE/pg/data/pg_hba.conf"
runuser -u postgres -- "$PGBIN/pg_ctl" -D "$STATE/pg/data" -l "$STATE/pg/pg.log" -w \
  -o "-c listen_addresses=127.0.0.1 -p $PG_PORT -k $STATE/pg -c password_encryption=scram-sha-256" start >/dev/null \
  || die "PostgreSQL did not start (see $STATE/pg/pg.log)"
admin() { PGPASSFILE="$SECRETS/pg-admin.pgpass" "$PGBIN/psql" -X -q -w -v ON_ERROR_STOP=1 -h 127.0.0.1 \
  -p "$PG_PORT" -U speclab_admin "$@"; }
"$PY" "$REPO/cluster/pg_verifier.py" "$SECRETS/mlflow.pgpass" speclab | admin -d postgres -f - >/dev/null \
  || die "could not create the role speclab (see $STATE/pg/pg.log)"
admin -d postgres -c "create database mlflow owner speclab" -c "revoke all on database mlflow from public" \
  >/dev/null || die "could not create the database mlflow (see $STATE/pg/pg.log)"

# MLflow: runs in PostgreSQL as the role speclab (its password from the pgpass file, not in the URI), artifacts on
# the shared folder, every request asked for a login by MLflow's basic-auth app. Its users live in a SQLite file
# of the owner's (STATE_DIR/mlflow-auth, mode 700; password hashes only). The one user, MLFLOW_USER, is an admin;
# every other login, and no login at all, gets NO_PERMISSIONS (no experiment, no run). Its password is random,
# in STATE_DIR/secrets/mlflow.pw alone: the server reads it once, from the auth config (mode 600), to create the
# user; then the line is removed. The CSRF key the app wants is random too, in the server's environment only
# (a root process's /proc/PID/environ is root's alone).
# In a session of its own, its pid written by itself: down.sh stops the server and its workers as one group.
MLFLOW_USER=speclab_owner
pw=$(openssl rand -hex 24)
printf '%s\n' "$pw" >"$SECRETS/mlflow.pw"
AUTH_INI="$SECRETS/mlflow-auth.ini"
auth_ini() {  # the config without its admin_password line once the user exists (MLflow then ignores it)
  printf '[mlflow]\ndefault_permission = NO_PERMISSIONS\ndatabase_uri = sqlite:///%s\nadmin_username = %s\n' \
    "$STATE/mlflow-auth/basic_auth.db" "$MLFLOW_USER"
  printf 'authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n'
  [ -z "${1:-}" ] || printf 'admin_password = %s\n' "$1"
}
auth_ini "$pw" >"$AUTH_INI"
chmod 600 "$SECRETS/mlflow.pw" "$AUTH_INI"
csrf_key=$(openssl rand -hex 32)
(cd "$STATE" && export MLFLOW_FLASK_SERVER_SECRET_KEY="$csrf_key" && unset MLFLOW_TRACKING_USERNAME \
   MLFLOW_TRACKING_PASSWORD MLFLOW_AUTH_ADMIN_USERNAME MLFLOW_AUTH_ADMIN_PASSWORD \
   && PGPASSFILE="$SECRETS/mlflow.pgpass" MLFLOW_AUTH_CONFIG_PATH="$AUTH_INI" MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false \
   setsid bash -c 'echo $$ >mlflow.pid; exec "$0" server --app-name basic-auth \
   --backend-store-uri "$1" --default-artifact-root "$2" --host 127.0.0.1 --port "$3" --workers 1' \
   "$REPO/.venv/bin/mlflow" "postgresql+psycopg2://speclab@127.0.0.1:$PG_PORT/mlflow" "$STATE/artifacts" \
   "$MLFLOW_PORT" >"$STATE/mlflow.log" 2>&1 &)
unset csrf_key
for _ in $(seq 1 60); do
  curl -sf "http://127.0.0.1:$MLFLOW_PORT/health" >/dev/null && break
  sleep 1
done
curl -sf "http://127.0.0.1:$MLFLOW_PORT/health" >/dev/null || die "mlflow server did not answer (see $STATE/mlflow.log)"
auth_ini >"$AUTH_INI"
# The login works (curl reads it from its stdin, not its command line) and no login gets nothing.
printf 'user = "%s:%s"\n' "$MLFLOW_USER" "$pw" | curl -sf -K - -o /dev/null \
  "http://127.0.0.1:$MLFLOW_PORT/api/2.0/mlflow/experiments/search?max_results=1" \
  || die "the MLflow server refused its own admin login (see $STATE/mlflow.log)"
unset pw
[ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$MLFLOW_PORT/api/2.0/mlflow/experiments/search")" = 401 ] \
  || die "the MLflow server answers without a login (see $STATE/mlflow.log)"
umask 022

# env.sh names the password file, never the password: sourcing it reads the file into the owner's shell, whose
# jobs (sbatch --export=ALL) log in with it.
cat >"$STATE/env.sh" <<ENV
export SLURM_CONF=$SLURM_CONF
export SPECLAB_TRACKING_URI=http://127.0.0.1:$MLFLOW_PORT
export SPECLAB_SHARED=$STATE/outputs
export MLFLOW_TRACKING_USERNAME=$MLFLOW_USER
export MLFLOW_TRACKING_PASSWORD="\$(cat $SECRETS/mlflow.pw)"
ENV
say "up: SLURM partition debug ($CPUS CPUs), MLflow http://127.0.0.1:$MLFLOW_PORT (user $MLFLOW_USER) on PostgreSQL" \
  ":$PG_PORT; source $STATE/env.sh"
