#!/usr/bin/env bash
# Train with torchrun on one node (every GPU by default) or on several.
#
#   scripts/launch.sh data=folder data.root=/data/imagenet                      # this node, all GPUs
#   NPROC=4 scripts/launch.sh ...                                                 # 4 processes
#   NNODES=2 MASTER=node0:29500 RDZV_ID=exp1 scripts/launch.sh ...                # run the same line on each node
#   RDZV_ID=exp1 scripts/launch.sh ...                                            # one node, a run the id names
#
# NPROC: processes per node (default: the GPUs nvidia-smi lists, or 1 without a GPU).
# NNODES, MASTER (host:port reachable from every node), RDZV_ID (the same on every node, and one per run, since it
# names the run folder, outputs/torchrun-<RDZV_ID>, which the same id later resumes: needed on several nodes; on one,
# a job without it gets a folder of its own), MAX_RESTARTS (elastic restarts; default 0 on one node, 3 on several),
# PYTHON (the interpreter with the project installed; default: python). torchrun is run as
# `python -m torch.distributed.run`, the same program, so that it is the one of that interpreter.
# Extra arguments are Hydra overrides for training.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
train=$(ls "$root"/src/*/train.py 2>/dev/null | head -n 1)
[ -n "$train" ] || { echo "launch.sh: no src/<package>/train.py under $root" >&2; exit 1; }
package=$(basename "$(dirname "$train")")

gpus=$(nvidia-smi -L 2>/dev/null | wc -l || true)
nproc=${NPROC:-$(( gpus > 0 ? gpus : 1 ))}
nnodes=${NNODES:-1}
python=${PYTHON:-python}

if [ "$nnodes" -gt 1 ]; then
    [ -n "${MASTER:-}" ] || { echo "launch.sh: NNODES=$nnodes needs MASTER=host:port of the first node" >&2; exit 1; }
    [ -n "${RDZV_ID:-}" ] || { echo "launch.sh: NNODES=$nnodes needs RDZV_ID, the same on every node and one per run (it names outputs/torchrun-<RDZV_ID>)" >&2; exit 1; }
fi
if [ -n "${RDZV_ID:-}" ]; then
    # Each restart gets its own store: torchrun's shared one would hand restarted workers stale addresses.
    export TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1
    default_restarts=$(( nnodes > 1 ? 3 : 0 ))
    # localhost:0, as torchrun --standalone has it: a free port on this one node.
    exec "$python" -m torch.distributed.run --nnodes="$nnodes" --nproc-per-node="$nproc" --rdzv-backend=c10d \
        --rdzv-endpoint="${MASTER:-localhost:0}" --rdzv-id="$RDZV_ID" --max-restarts="${MAX_RESTARTS:-$default_restarts}" \
        -m "$package.train" "$@"
fi
exec "$python" -m torch.distributed.run --standalone --nproc-per-node="$nproc" --max-restarts="${MAX_RESTARTS:-0}" -m "$package.train" "$@"
