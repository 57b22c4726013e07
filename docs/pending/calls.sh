#!/usr/bin/env bash
# The pending patches' device calls (README.md), one per invocation, on the GPU machine from the
# repository root of wip/pending (main + docs/pending/*.mbox):
#   bash docs/pending/calls.sh N     # N = 4, 2, 6 or 5; writes $OUT/t/r.tgz (results + session.log)
# carry: .whl and .gpu/pack always; .ab for 2; .peers/flashinfer, .peers/sglang and
# .peers/vllm_fused_moe for 5 (and no .ab: 64 MiB in all). CALL_LIMIT (s, default 470) bounds the
# session so that its results are packed within the device tool's limit: a machine start takes
# ~5-6 minutes of the session's device budget, so lower it when little budget is left.
set -uo pipefail
call=${1:?usage: calls.sh 4|2|6|5}
: "${OUT:?the device tool sets OUT}"
export KERNELS_COMMIT=${KERNELS_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
case "$call" in
  4) export TESTS_FILE=docs/pending/gpu-tests-4.txt TESTS_TIMEOUT=${TESTS_LIMIT:-420} ;;
  2) # hadamard (12), layernorm bf16 (11); then layernorm in fp16 (02, 11; KERNELS_BENCH_DTYPE
     # is read by the layernorm suite alone)
     export AB="quantization layernorm"
     export AB_OPS="hadamard_transform layernorm"
     export RUN="KERNELS_BENCH_DTYPE=float16 timeout -s INT 100 python3 -m shared.bench.ab run \
       --group layernorm --op layernorm" ;;
  6) # patches 13 and 14 (reworks of 01, 03/06, 04): their tests, then each path off / default / on
     export TESTS_FILE=docs/pending/gpu-tests-6.txt TESTS_TIMEOUT=${TESTS_LIMIT:-240}
     export RUN="timeout -s INT 90 python3 docs/pending/small_m_ab.py;
       timeout -s INT 90 python3 docs/pending/thresholds_ab.py" ;;
  5) # main's sweep of the groups landed on 2026-12-05 beside the peers, in one run (issue 12's
     # top_k_mask >= 2x FlashInfer and min_p vs torch.compile; issue 11's fused_moe beside vLLM's
     # Triton kernel, never run yet); works on main itself, no patch needed
     export BENCH="${BENCH:-sampling moe quantization}" STATIC_COMPILE=large BENCH_TIMEOUT=420 ;;
  *) echo "calls.sh: no call $call (4, 2, 6 or 5)" >&2; exit 2 ;;
esac
timeout -k 10 -s INT "${CALL_LIMIT:-470}" bash shared/bench/gpu_session.sh >"$OUT/session.log" 2>&1
status=$?
mkdir -p "$OUT/t"
tar czf "$OUT/t/r.tgz" -C "$OUT" results session.log 2>/dev/null
rm -rf "$OUT/results" "$OUT/session.log" "$OUT/results.tar.gz"
echo "call $call: gpu_session exit $status"
exit $status
