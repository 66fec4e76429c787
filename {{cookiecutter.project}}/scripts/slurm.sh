#!/usr/bin/env bash
# Train under Slurm: scripts/launch.sh on each node, which starts one training process per GPU with torchrun.
# Submit it from the project's folder, with the overrides for training:
#
#   sbatch --nodes=2 --gpus-per-node=8 --time=24:00:00 scripts/slurm.sh data=folder data.root=/data/imagenet
#
# The job's id names the run: its folder is outputs/torchrun-slurm-<job id>. A job that Slurm requeues, preempted or
# at its time limit, comes back under the same id and carries its run on from the checkpoint; a new job starts a
# new run. Preemption and `scontrol requeue` send SIGTERM to every process: training stops at the end of its logging
# window, saves, and exits. That must happen within the cluster's KillWait (`scontrol show config | grep KillWait`),
# after which Slurm sends SIGKILL. Three minutes before the time limit, Slurm sends USR1 to this script, which
# requeues the job: the same stop, then the same resume.
#
# PYTHON, NPROC and MAX_RESTARTS are scripts/launch.sh's. RDZV_PORT: the rendezvous port on the first node
# (default: 20000 plus the job id's last four digits, so that jobs sharing a first node do not collide).
#
#SBATCH --job-name=train
#SBATCH --ntasks-per-node=1
#SBATCH --exclusive
#SBATCH --mem=0
#SBATCH --requeue
#SBATCH --signal=B:USR1@180
#SBATCH --open-mode=append
#SBATCH --output=slurm-%j.out
set -euo pipefail

cd "$SLURM_SUBMIT_DIR"
first_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
export NNODES=$SLURM_JOB_NUM_NODES RDZV_ID=slurm-$SLURM_JOB_ID
export MASTER=$first_node:${RDZV_PORT:-$(( 20000 + SLURM_JOB_ID % 10000 ))}
if [ -n "${SLURM_GPUS_ON_NODE:-}" ]; then
    export NPROC=${NPROC:-$SLURM_GPUS_ON_NODE}
fi
echo "slurm.sh: job $SLURM_JOB_ID, start $(( ${SLURM_RESTART_COUNT:-0} + 1 )), on $SLURM_JOB_NODELIST: outputs/torchrun-$RDZV_ID"

# The time limit's warning: requeue, which stops the run as a preemption does.
trap 'echo "slurm.sh: the time limit is near: requeued"; scontrol requeue "$SLURM_JOB_ID"' USR1
# In the background, because bash runs a trap only once the command in the foreground ends; wait returns at once.
srun --cpus-per-task="$SLURM_CPUS_ON_NODE" --kill-on-bad-exit=1 scripts/launch.sh "$@" &
training=$!
wait "$training" || wait "$training"
