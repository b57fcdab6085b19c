#!/usr/bin/env bash
# The cluster of cluster/up.sh STATE_DIR is its owner's alone (cluster/test.sh runs this as root, right after up):
#   - slurmctld, slurmd, PostgreSQL and MLflow listen on 127.0.0.1 only;
#   - a second local user (nobody) can read no password file, cannot connect to PostgreSQL (no password, a wrong
#     one, the socket), cannot use munge or submit a SLURM job;
#   - the postgres OS user itself needs a password on the local socket;
#   - MLflow's role is no superuser: `COPY ... TO PROGRAM` fails for it even with its password;
#   - the MLflow server asks every request for a login: nobody's calls to its REST API, without credentials,
#     with a wrong password or an unknown user, are refused (401/403), the owner's login is not;
#   - no password is on a command line, in an environment or in any file outside STATE_DIR/secrets.
#     cluster/test_owner.sh STATE_DIR     (SLURM_PORT, PG_PORT, MLFLOW_PORT as given to up.sh)
set -uo pipefail
STATE=$(realpath "${1:?usage: cluster/test_owner.sh STATE_DIR}")
SLURM_PORT=${SLURM_PORT:-16817}
PG_PORT=${PG_PORT:-15432}
MLFLOW_PORT=${MLFLOW_PORT:-15055}
PGBIN=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)
SECRETS="$STATE/secrets"
failed=0
bad() { echo "cluster test: $*" >&2; failed=1; }
as_nobody() { timeout 30 runuser -u nobody -- env -i PATH=/usr/bin:/bin HOME=/nonexistent "$@" 2>&1; }

# Listeners: each port has one, on 127.0.0.1 alone.
for port in "$SLURM_PORT" $((SLURM_PORT + 1)) "$PG_PORT" "$MLFLOW_PORT"; do
  addrs=$(ss -Hltn "sport = :$port" | awk '{print $4}' | sort -u | tr '\n' ' ')
  [ -n "$addrs" ] || bad "nothing listens on port $port"
  for addr in $addrs; do
    [ "$addr" = "127.0.0.1:$port" ] || bad "port $port listens on $addr, beyond 127.0.0.1"
  done
done

# The password files: the owner's alone.
mode() { stat -c '%a %U' "$1" 2>/dev/null || echo missing; }
[ "$(mode "$SECRETS")" = "700 $(id -un)" ] || bad "$SECRETS is $(mode "$SECRETS"), not 700 $(id -un)"
for f in "$SECRETS/pg-admin.pgpass" "$SECRETS/mlflow.pgpass" "$SECRETS/mlflow.pw" "$SECRETS/mlflow-auth.ini"; do
  [ "$(mode "$f")" = "600 $(id -un)" ] || bad "$f is $(mode "$f"), not 600 $(id -un)"
  as_nobody cat "$f" >/dev/null && bad "nobody can read $f"
done
[ "$(stat -c %a "$STATE/munge")" = 700 ] || bad "$STATE/munge (the munge socket's folder) is not mode 700"
[ "$(mode "$STATE/mlflow-auth")" = "700 $(id -un)" ] || bad "$STATE/mlflow-auth (MLflow's users) is not 700 $(id -un)"
as_nobody cat "$STATE/mlflow-auth/basic_auth.db" >/dev/null && bad "nobody can read MLflow's users"

# A second local user cannot connect: no password, a wrong one, the owner's pgpass file, the socket.
refused() {  # WHY EXPECTED_MESSAGE ENV_ASSIGNMENT ROLE DATABASE: nobody's connection must fail with that message
  local out
  if out=$(as_nobody ${3:+"$3"} "$PGBIN/psql" -X -w -h 127.0.0.1 -p "$PG_PORT" -U "$4" -d "$5" -c "select 1"); then
    bad "nobody connected to PostgreSQL as $4 $1"
  elif ! grep -q "$2" <<<"$out"; then
    bad "nobody's connection as $4 $1 failed, but not for the expected reason ($2): $out"
  fi
}
for who in "speclab mlflow" "speclab_admin postgres"; do
  # shellcheck disable=SC2086 # ROLE DATABASE, two words
  refused "without a password" "no password supplied" "" $who
  refused "with a wrong password" "password authentication failed" PGPASSWORD=not-the-password $who
  refused "with the owner's pgpass file" "no password supplied" PGPASSFILE="$SECRETS/mlflow.pgpass" $who
done
out=$(as_nobody "$PGBIN/psql" -X -w -h "$STATE/pg" -p "$PG_PORT" -U speclab -d mlflow -c "select 1") \
  && bad "nobody connected through the local socket"
out=$(timeout 30 runuser -u postgres -- env -i PATH=/usr/bin:/bin "$PGBIN/psql" -X -w -h "$STATE/pg" -p "$PG_PORT" \
  -U speclab_admin -d postgres -c "select 1" 2>&1) && bad "the postgres OS user connected to the socket without a password"
grep -q "no password supplied" <<<"$out" || bad "the local socket did not ask the postgres OS user for a password: $out"

# MLflow's role: owns its database, is no superuser, and cannot run a program even with its password.
owner() { PGPASSFILE="$SECRETS/$1.pgpass" timeout 30 "$PGBIN/psql" -X -w -A -t -h 127.0.0.1 -p "$PG_PORT" "${@:2}" 2>&1; }
got=$(owner pg-admin -U speclab_admin -d postgres -c "select rolsuper, rolcreatedb, rolcreaterole, \
  (select pg_get_userbyid(datdba) from pg_database where datname = 'mlflow') from pg_roles where rolname = 'speclab'")
[ "$got" = "f|f|f|speclab" ] || bad "role speclab (superuser|createdb|createrole|owner of mlflow) is $got, not f|f|f|speclab"
marker="/tmp/speclab-cluster-copy-to-program.$$"
rm -f "$marker"
out=$(owner mlflow -U speclab -d mlflow -c "COPY (select 1) TO PROGRAM 'id > $marker'") \
  && bad "COPY ... TO PROGRAM ran for the role speclab"
grep -q "permission denied\|must be superuser" <<<"$out" || bad "COPY ... TO PROGRAM failed, but not for want of rights: $out"
[ -e "$marker" ] && { bad "COPY ... TO PROGRAM wrote $marker"; rm -f "$marker"; }

# MLflow: a second local user reaches the port but gets nothing from the REST API (read or write) without the
# owner's login; the owner's login (read here from its file, given to curl on its stdin) gets an answer.
MLFLOW="http://127.0.0.1:$MLFLOW_PORT"
MLFLOW_USER=$(sed -n 's/^admin_username = //p' "$SECRETS/mlflow-auth.ini" 2>/dev/null)
status() { curl -s -o /dev/null -w '%{http_code}' --max-time 20 "$@"; }
calls=("$MLFLOW/api/2.0/mlflow/experiments/search?max_results=10"
       "-X POST -H Content-Type:application/json -d {} $MLFLOW/api/2.0/mlflow/runs/search"
       "-X POST -H Content-Type:application/json -d {\"name\":\"nobodys\"} $MLFLOW/api/2.0/mlflow/experiments/create"
       "$MLFLOW/ajax-api/2.0/mlflow/experiments/search?max_results=10")
set -f  # the calls are split into curl's words, never globbed
for call in "${calls[@]}"; do
  for login in "" "-u ${MLFLOW_USER:-speclab_owner}:not-the-password" "-u nobody:not-the-password"; do
    # shellcheck disable=SC2086 # curl's arguments, several words
    got=$(as_nobody curl -s -o /dev/null -w '%{http_code}' --max-time 20 $login $call)
    [ "$got" = 401 ] || [ "$got" = 403 ] \
      || bad "nobody's MLflow call ${login:-without a login} (curl $call) answered $got, not 401/403"
  done
done
set +f
got=$(printf 'user = "%s:%s"\n' "$MLFLOW_USER" "$(cat "$SECRETS/mlflow.pw" 2>/dev/null)" | status -K - "${calls[0]}")
[ "$got" = 200 ] || bad "the owner's MLflow login (user ${MLFLOW_USER:-missing}) answered $got, not 200"

# Munge and SLURM: the socket is out of a second user's reach, so are its jobs.
as_nobody munge -n -S "$STATE/munge/munge.sock" >/dev/null && bad "nobody can use the munge socket"
as_nobody SLURM_CONF="$STATE/slurm/slurm.conf" sbatch --wrap true >/dev/null && bad "nobody can submit a SLURM job"

# The passwords are nowhere but in their files: not on a command line, in an environment or another file.
patterns="$SECRETS/passwords.grep"
[ -d "$SECRETS" ] && (umask 077 && { cut -d: -f5 "$SECRETS"/*.pgpass; cat "$SECRETS/mlflow.pw"; } >"$patterns" \
  2>/dev/null)
[ "$(wc -l <"$patterns" 2>/dev/null)" = 3 ] || bad "not the 3 password files (2 pgpass, mlflow.pw) in $SECRETS"
[ -s "$patterns" ] || { echo "cluster test: no password files to look for"; exit 1; }
ps -eo args | grep -qF -f "$patterns" && bad "a password is on a command line (ps)"
# The owner's shell holds MLflow's password as MLFLOW_TRACKING_PASSWORD (env.sh), which is where it belongs.
for environ in /proc/[0-9]*/environ; do
  tr '\0' '\n' 2>/dev/null <"$environ" | grep -v '^MLFLOW_TRACKING_PASSWORD=' | grep -qaF -f "$patterns" \
    && bad "a password is in the environment of process ${environ//[^0-9]/}"
done
server=$(pgrep -g "$(cat "$STATE/mlflow.pid" 2>/dev/null)" 2>/dev/null)  # the MLflow server and its workers
[ -n "$server" ] || bad "no MLflow server process in the group of $STATE/mlflow.pid"
for pid in $server; do
  grep -qaF -f "$patterns" "/proc/$pid/environ" 2>/dev/null && bad "a password is in the MLflow server's environment ($pid)"
done
found=$(grep -rlaF -f "$patterns" --exclude-dir=secrets "$STATE")
[ -z "$found" ] || bad "a password is written outside $SECRETS: $found"
rm -f "$patterns"

[ $failed -eq 0 ] && echo "cluster test: the cluster is its owner's (127.0.0.1 only, passwords asked and private, \
no superuser, MLflow only with its login)"
exit $failed
