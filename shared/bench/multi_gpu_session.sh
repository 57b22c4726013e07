#!/usr/bin/env bash
# One device call for the multi-GPU session (issue 15): the communication group's multigpu tests
# and its benchmark against NCCL, one process per GPU under torchrun. Writes
# docs/benchmarks/communication.json (with the world size) and $OUT/ logs when $OUT is set.
# NVLink multicast stays off: no NVLS/multimem path exists here; NCCL_NVLS_ENABLE=0 keeps NCCL off
# it as well, so both sides of the comparison use the same links.
set -uo pipefail
cd "$(dirname "$0")/../.."
NGPU=$(nvidia-smi -L | wc -l)
OUTDIR=${OUT:-/tmp/multi_gpu_session}
mkdir -p "$OUTDIR" docs/benchmarks
export NCCL_NVLS_ENABLE=0
echo "GPUs: $NGPU"
if [ "$NGPU" -lt 2 ]; then
  echo "fewer than 2 GPUs: nothing to run"; exit 0
fi
status=0
torchrun --standalone --nproc-per-node="$NGPU" -m pytest tests/communication -m multigpu -q \
  -p no:cacheprovider 2>&1 | tee "$OUTDIR/multigpu_tests.log" || status=1
torchrun --standalone --nproc-per-node="$NGPU" -m shared.bench.suites.communication \
  2>&1 | tee "$OUTDIR/communication_bench.log" || status=1
cp docs/benchmarks/communication.json "$OUTDIR/" 2>/dev/null || true
exit $status
