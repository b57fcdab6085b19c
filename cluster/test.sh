#!/usr/bin/env bash
# make test-cluster: the steps of docs/cluster.md, one by one, on a throwaway single-node cluster.
# Starts munge, SLURM, PostgreSQL and an MLflow server (cluster/up.sh, installing what is missing), runs a 4-job
# sweep of the tiny pair as one SLURM job array, cancels one job mid-run, reruns the same command (only that job
# runs again), checks every Parquet file and MLflow run (cluster/check.py), and tears everything down.
set -uo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
cd "$REPO"
STATE=$(mktemp -d /tmp/speclab-cluster.XXXXXX)
trap 'cluster/down.sh "$STATE" >/dev/null' EXIT
trap 'exit 1' INT TERM
t0=$(date +%s)
cluster/up.sh "$STATE" || exit 1
source "$STATE/env.sh"
echo "cluster test: services up in $(( $(date +%s) - t0 )) s"

# The sweep (docs/cluster.md, step 3): 4 jobs, one SLURM array; two of them long enough to be cancelled while they run.
sweep() {
  .venv/bin/python -m pipeline.run -m +launcher=slurm_cpu pair=tiny_random prompts=smoke stage=speed \
    'stage.ks=[1,2]' k=1,2 stage.rounds=1,40 max_new_tokens=8 campaign=cluster \
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
echo "cluster test: passed in $(( $(date +%s) - t0 )) s"
