#!/usr/bin/env bash
# make test-cluster: the steps of docs/cluster.md, one by one, on a throwaway single-node cluster.
# Starts munge, SLURM, PostgreSQL and an MLflow server (cluster/up.sh, installing what is missing), runs a 4-job
# sweep of the tiny pair as one SLURM job array, cancels one job mid-run, reruns the same command (only that job
# runs again), checks every Parquet file and MLflow run (cluster/check.py; the jobs log in to MLflow with the
# owner's login from env.sh), that the cluster is its owner's (cluster/test_owner.sh), that a password in the
# tracking URI is in no file of a SLURM sweep and the cluster's own passwords in none outside its secrets folder
# (cluster/test_secret.sh), and tears everything down: no daemon may be left running, whatever the exit.
set -uo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
cd "$REPO"
export SLURM_PORT=${SLURM_PORT:-16817} PG_PORT=${PG_PORT:-15432} MLFLOW_PORT=${MLFLOW_PORT:-15055}
STATE=$(mktemp -d /tmp/speclab-cluster.XXXXXX)
SWEEP=""
finish() {
  local rc=$? port
  [ -n "${SWEEP:-}" ] && { pkill -TERM -P "$SWEEP"; kill "$SWEEP"; } 2>/dev/null  # a sweep still waiting on jobs
  cluster/down.sh "$STATE" >/dev/null
  for port in "$SLURM_PORT" $((SLURM_PORT + 1)) "$PG_PORT" "$MLFLOW_PORT"; do
    [ -z "$(ss -Hltn "sport = :$port")" ] || { echo "cluster test: port $port still listened on after down.sh" >&2; rc=1; }
  done
  exit $rc
}
trap finish EXIT
trap 'exit 1' INT TERM
t0=$(date +%s)
cluster/up.sh "$STATE" || exit 1
source "$STATE/env.sh"
echo "cluster test: services up in $(( $(date +%s) - t0 )) s"
cluster/test_owner.sh "$STATE" || exit 1

# The sweep (docs/cluster.md, step 3): 4 jobs, one SLURM array; two of them long enough to be cancelled while they run
# (the fixed design: a race would stop the 40-round jobs within a second on the tiny model).
sweep() {
  .venv/bin/python -m pipeline.run -m +launcher=slurm_cpu pair=tiny_random prompts=smoke stage=speed \
    'stage.ks=[1,2]' k=1,2 stage.rounds=1,40 stage.race=false stage.precision=null max_new_tokens=8 campaign=cluster \
    outputs_dir="$SPECLAB_SHARED" mlflow.tracking_uri="$SPECLAB_TRACKING_URI" hydra.sweep.dir="$STATE/sweeps/$1"
}
t1=$(date +%s)
sweep first >"$STATE/first.log" 2>&1 &
SWEEP=$!
job=""
for _ in $(seq 1 120); do  # the second array task (k=1, 40 rounds): cancel it once its stage is running
  job=$(squeue -h -o "%i %T" | awk '$1 ~ /_1$/ && $2 == "RUNNING" {print $1}')
  [ -n "$job" ] && grep -qs "\[speed\] running:" "$STATE"/sweeps/first/.submitit/"$job"/*_log.* && break
  job=""
  sleep 1
done
[ -n "$job" ] || { echo "cluster test: array task 1 never ran its stage" >&2; cat "$STATE/first.log" >&2; exit 1; }
sleep 2
scancel "$job"
echo "cluster test: cancelled $job mid-run"
wait $SWEEP
rc=$?
SWEEP=""
grep -v "sacct\|accounting storage" "$STATE/first.log" | grep -A8 "^multirun of" || true
[ $rc -ne 0 ] || { echo "cluster test: the sweep with a cancelled job exited 0" >&2; exit 1; }
grep -q "| killed " "$STATE/first.log" || { echo "cluster test: the summary does not name the killed job" >&2; exit 1; }
echo "cluster test: first sweep $(( $(date +%s) - t1 )) s (exit $rc, the cancelled job named)"

t2=$(date +%s)
sweep rerun >"$STATE/rerun.log" 2>&1 || { echo "cluster test: the rerun failed" >&2; cat "$STATE/rerun.log" >&2; exit 1; }
grep -q "status: 3 complete, 1 computed" "$STATE/rerun.log" \
  || { echo "cluster test: the rerun did not run only the missing job" >&2; grep -A8 "^multirun of" "$STATE/rerun.log" >&2; exit 1; }
echo "cluster test: rerun $(( $(date +%s) - t2 )) s (only the cancelled job ran)"

.venv/bin/python cluster/check.py "$SPECLAB_SHARED" cluster "$SPECLAB_TRACKING_URI" 4 || exit 1

t3=$(date +%s)
cluster/test_secret.sh "$STATE" || exit 1
echo "cluster test: secret sweep $(( $(date +%s) - t3 )) s"
echo "cluster test: passed in $(( $(date +%s) - t0 )) s"
