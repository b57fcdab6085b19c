#!/usr/bin/env bash
# The SLURM leg of the secret test (cluster/test.sh runs it on the cluster of cluster/up.sh, env.sh sourced):
# a 2-job sweep through SLURM with a password in the tracking URI, the only login its jobs have (the owner's
# MLFLOW_TRACKING_* are unset for it; the URI's user is made on the server first, with EDIT on the experiment),
# so its runs are logged only if the jobs log in with it. Then no file it wrote may hold that password, plain or
# percent-encoded: the shared outputs folder, the sweep's Hydra folders and submitit folder (pickles, logs),
# MLflow's artifacts folder and server log, the command's own output and a pg_dump of MLflow's database. Nor may
# any file of the cluster outside STATE_DIR/secrets hold one of the cluster's own passwords (PostgreSQL's, MLflow's
# login) after all its sweeps.
#     cluster/test_secret.sh STATE_DIR
set -uo pipefail
STATE=$(realpath "${1:?usage: cluster/test_secret.sh STATE_DIR}")
REPO=$(cd "$(dirname "$0")/.." && pwd)
cd "$REPO"
: "${SPECLAB_SHARED:?source STATE_DIR/env.sh first}" "${SPECLAB_TRACKING_URI:?source STATE_DIR/env.sh first}"
PG_PORT=${PG_PORT:-15432}
PGBIN=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)
SECRET=S3cr3tPW-of-alice  # MLflow wants 12 characters or more
SWEEP="$STATE/sweeps/secret"
URI="http://alice:$SECRET@${SPECLAB_TRACKING_URI#http://}"

# alice: a user of the MLflow server who may log runs in the experiment speclab, nothing else (made by the owner).
SECRET="$SECRET" .venv/bin/python -W ignore - "$SPECLAB_TRACKING_URI" <<'MAKE_USER' \
  || { echo "cluster test: could not make the MLflow user alice" >&2; exit 1; }
import os, sys, mlflow
from mlflow.server import get_app_client
client = mlflow.MlflowClient(sys.argv[1])
exp = client.get_experiment_by_name("speclab")
exp_id = exp.experiment_id if exp else client.create_experiment("speclab")
users = get_app_client("basic-auth", tracking_uri=sys.argv[1])
users.create_user("alice", os.environ["SECRET"])
users.grant_user_permission("alice", "experiment", exp_id, "EDIT")
MAKE_USER

env -u MLFLOW_TRACKING_USERNAME -u MLFLOW_TRACKING_PASSWORD \
  .venv/bin/python -m pipeline.run +sweep=speed +launcher=slurm_cpu pair=tiny_random prompts=smoke k=1,2 round=0 \
  rotation=0 stage.rounds=1 max_new_tokens=8 campaign=secret outputs_dir="$SPECLAB_SHARED" \
  "mlflow.tracking_uri=$URI" hydra.sweep.dir="$SWEEP" >"$STATE/secret.log" 2>&1
rc=$?
[ $rc -eq 0 ] || { echo "cluster test: the sweep with a password in its tracking URI failed (exit $rc)" >&2
                   tail -20 "$STATE/secret.log" >&2; exit 1; }
grep -q "status: 2 computed" "$STATE/secret.log" \
  || { echo "cluster test: the secret sweep did not run its 2 jobs" >&2; grep -A6 "^multirun of" "$STATE/secret.log" >&2; exit 1; }
runs=$(.venv/bin/python - "$SPECLAB_TRACKING_URI" <<'PY'
import sys, mlflow
client = mlflow.MlflowClient(sys.argv[1])
exp = client.get_experiment_by_name("speclab")
print(len(client.search_runs([exp.experiment_id], "tags.campaign = 'secret' and tags.level = 'stage'")))
PY
)
[ "$runs" = 2 ] || { echo "cluster test: the secret sweep logged $runs stage runs to MLflow, 2 expected" >&2; exit 1; }

PGPASSFILE="$STATE/secrets/pg-admin.pgpass" "$PGBIN/pg_dump" -w -h 127.0.0.1 -p "$PG_PORT" -U speclab_admin mlflow \
  >"$STATE/mlflow-dump.sql" || { echo "cluster test: pg_dump of the mlflow database failed" >&2; exit 1; }
forms=$(.venv/bin/python -c "import sys, urllib.parse as u; print(*{sys.argv[1], u.quote(sys.argv[1], safe='')}, sep='\n')" \
  "$SECRET")
found=$(grep -rlaF "$forms" "$SPECLAB_SHARED" "$SWEEP" "$STATE/artifacts" "$STATE/mlflow.log" "$STATE/secret.log" \
  "$STATE/mlflow-dump.sql")
if [ -n "$found" ]; then
  echo "cluster test: the password of the tracking URI is written in:" >&2
  sed 's/^/  /' <<<"$found" >&2
  exit 1
fi
held=$(grep -rlaF "$forms" "$STATE/slurm" 2>/dev/null | head -3)
[ -z "$held" ] || echo "cluster test: note: SLURM's own state (root only) holds the job environment: ${held//$'\n'/ }"

# The cluster's own passwords: in STATE_DIR/secrets alone (SLURM's job environments, root's, noted as above).
own=$({ cut -d: -f5 "$STATE"/secrets/*.pgpass; cat "$STATE/secrets/mlflow.pw"; } 2>/dev/null)
[ "$(wc -l <<<"$own")" = 3 ] || { echo "cluster test: not the 3 password files in $STATE/secrets" >&2; exit 1; }
found=$(grep -rlaF "$own" --exclude-dir=secrets "$STATE" | grep -v "^$STATE/slurm/\(state\|spool\)/")
if [ -n "$found" ]; then
  echo "cluster test: a password of the cluster is written outside $STATE/secrets:" >&2
  sed 's/^/  /' <<<"$found" >&2
  exit 1
fi
held=$(grep -rlaF "$own" "$STATE/slurm" 2>/dev/null | head -3)
[ -z "$held" ] || echo "cluster test: note: SLURM's own state (root only) holds the owner's job environment:" \
  "${held//$'\n'/ }"
echo "cluster test: no file of the SLURM sweep holds the password of its tracking URI ($(find "$SPECLAB_SHARED" "$SWEEP" \
  "$STATE/artifacts" -type f | wc -l) files and a pg_dump searched)"
