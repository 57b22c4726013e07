#!/usr/bin/env bash
# One GPU session from a source checkout: environment, GPU tests, `kernels-ops check`, benchmarks.
# Results (logs, JSON, markdown, plots) are packed into $OUT/results.tar.gz.
#
#   TESTS="tests/elementwise" [TESTS_K="not compile"] BENCH="elementwise" [QUICK=1] \
#     [SANITIZE="tests/x.py::t"] [BENCH_TIMEOUT=seconds] [KERNELS_COMMIT=abc1234] \
#     shared/bench/gpu_session.sh
#
# TESTS_K is pytest's -k expression. Run the tests in one process: with pytest-xdist (-n 8) the
# three groups' GPU tests had reached 32% after 10 minutes, where one process runs them all in
# about 6.5 (2026-12-02; likely each worker's inductor compile pool for the torch.compile tests).
#
# Carried wheels (apache-tvm-ffi, liger-kernel for cp312) in .whl/ are installed first.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${OUT:-/tmp/kernels-out}
RESULTS=$OUT/results
mkdir -p "$RESULTS"
cd "$ROOT"
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl
  SITE=/tmp/site:
fi
export PYTHONPATH=$(ls -d "$ROOT"/packages/*/src | tr '\n' ':')${SITE:-}$ROOT
export KERNELS_CACHE_DIR=${KERNELS_CACHE_DIR:-/tmp/kernels-cache} PYTHONUNBUFFERED=1
status=0
{
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv
  python3 -c "import torch, triton, tvm_ffi; print(torch.__version__, triton.__version__, tvm_ffi.__version__)"
} 2>&1 | tee "$RESULTS/env.txt"
if [ -n "${TESTS:-}" ]; then
  python3 -m pytest $TESTS ${TESTS_K:+-k "$TESTS_K"} -m gpu -q -p no:cacheprovider -p no:logging \
    --timeout=900 \
    --junitxml="$RESULTS/gpu-tests.xml" 2>&1 | tee "$RESULTS/gpu-tests.log" | tail -40
  status=$((status | PIPESTATUS[0]))
fi
if [ -n "${SANITIZE:-}" ]; then
  compute-sanitizer --tool memcheck --error-exitcode 9 python3 -m pytest $SANITIZE -m gpu -q \
    -p no:cacheprovider -p no:logging 2>&1 | tee "$RESULTS/memcheck.log" | tail -15
  status=$((status | PIPESTATUS[0]))
fi
if [ -n "${CHECK:-}" ]; then
  COLUMNS=160 python3 -m kernels_ops check $CHECK 2>&1 | tee "$RESULTS/check.log" | tail -60
  status=$((status | PIPESTATUS[0]))
fi
if [ -n "${BENCH:-}" ]; then
  args=()
  for g in $BENCH; do args+=(--group "$g"); done
  [ -n "${QUICK:-}" ] && args+=(--quick)
  # BENCH_TIMEOUT (s) stops the sweep early; the groups already finished keep their results.
  timeout --signal=INT "${BENCH_TIMEOUT:-0}" \
    python3 -m shared.bench.run "${args[@]}" --out "$RESULTS/benchmarks" 2>&1 \
    | tee "$RESULTS/bench.log" | grep -v "━" | tail -150
  status=$((status | PIPESTATUS[0]))
fi
tar czf "$OUT/results.tar.gz" -C "$OUT" results
echo "gpu_session exit status $status"
exit $status
