#!/usr/bin/env bash
# The pending patches' device calls (README.md), one per invocation, on the GPU machine from the
# repository root of wip/pending (main + docs/pending/*.mbox):
#   bash docs/pending/calls.sh N     # N = 1..5; writes $OUT/t/r.tgz (results + session.log)
# carry: .whl and .gpu/pack always; .ab for 2 and 4; .peers/flashinfer, .peers/sglang and
# .peers/vllm_fused_moe for 5. Each call stays under the device tool's 600 s (470 s here, then
# the results that exist are packed).
set -uo pipefail
call=${1:?usage: calls.sh 1..5}
: "${OUT:?the device tool sets OUT}"
export KERNELS_COMMIT=${KERNELS_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
case "$call" in
  1) export TESTS_FILE=docs/pending/gpu-tests-1.txt TESTS_TIMEOUT=400 ;;
  2) export AB="sampling quantization moe"
     export AB_OPS="top_k_renorm top_p_renorm top_k_mask min_p top_k_top_p per_tensor topk_softmax
       gate_topk moe_sum_reduce" ;;
  3) export TESTS_FILE=docs/pending/gpu-tests-2.txt TESTS_TIMEOUT=400 ;;
  4) # layernorm's A/B in fp16 (patch 04; KERNELS_BENCH_DTYPE is read by the layernorm suite
     # alone, and the prefix also picks diffusion.layernorm_scale_shift, in bf16); patch 03
     # changes group_norm_silu's C++ signature (no A/B twin): its own script, through RUN
     export AB="kvcache diffusion gemm mamba layernorm" KERNELS_BENCH_DTYPE=float16
     export AB_OPS="store_cache reshape_and_cache_flash set_mla_kv_buffer timestep_embedding dsv3
       causal_conv1d layernorm"
     export RUN="timeout -s INT 90 python3 docs/pending/group_norm_ab.py" ;;
  5) export BENCH="sampling moe quantization" STATIC_COMPILE=large BENCH_TIMEOUT=420 ;;
  *) echo "calls.sh: no call $call (1..5)" >&2; exit 2 ;;
esac
timeout -k 10 -s INT 470 bash shared/bench/gpu_session.sh >"$OUT/session.log" 2>&1
status=$?
mkdir -p "$OUT/t"
tar czf "$OUT/t/r.tgz" -C "$OUT" results session.log 2>/dev/null
rm -rf "$OUT/results" "$OUT/session.log" "$OUT/results.tar.gz"
echo "call $call: gpu_session exit $status"
exit $status
