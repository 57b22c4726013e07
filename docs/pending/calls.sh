#!/usr/bin/env bash
# The pending patches' device calls (README.md), on the GPU machine from the repository root of
# wip/pending (main + docs/pending/*.mbox); each writes $OUT/t/r.tgz (results + session.log):
#   bash docs/pending/calls.sh tests  # GPU tests of 16 (fused_moe's same-arch table)
#   bash docs/pending/calls.sh bench  # fused_moe beside vLLM's Triton kernel, ncu profiles of
#                                     # seven misses, the session-18 changes beside their peers
#   bash docs/pending/calls.sh tune   # on a GPU without a fused_moe table (an H100): tunes the two
#                                     # model shapes into results/fused_moe_<device>.json (~8 min)
#   bash docs/pending/calls.sh decode # on the H200 (needs_h200): 21's tests and A/B (carry .ab of
#                                     # memory), the late-load kernel past two waves, then the
#                                     # sweeps of issue 12's groups (~7 min on an H100)
#   bash docs/pending/calls.sh last   # on the H200: diffusion, decode_attention, mamba (~2.5 min)
# carry: .whl; .gpu/pack (if built for this stack); .peers/vllm_fused_moe for bench;
# .peers/{sglang,sglang_memory,flashinfer} for decode; .peers/{sglang,flashinfer,
# vllm_decode_attention} for last.
# CALL_LIMIT (s, default 560) bounds the session so that its results are packed within the device
# tool's limit.
set -uo pipefail
: "${OUT:?the device tool sets OUT}"
export OUT
export KERNELS_COMMIT=${KERNELS_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
# Shell helpers for RUN: t SECONDS PYTEST_ARGS... (GPU tests), sweep SECONDS GROUP COMPILE
# [RUN_ARGS...] (one group's benchmarks beside its peers into results/sweep).
HELPERS='t() { timeout -s INT -k 20 "$1" python3 -m pytest "${@:2}" -m gpu -q -p no:cacheprovider --timeout 200 2>&1 | tail -3; }
sweep() { timeout -s INT "$1" python3 -m shared.bench.run --group "$2" --static-compile "$3" "${@:4}" --out "$OUT/results/sweep" 2>&1 | grep -v "━" | tail -45; }
'
case "${1:-}" in
  tune)
    # The buckets that matter first (an interrupted run keeps the finished ones), in
    # gpu_session.sh's environment (wheels, PYTHONPATH, module cache); the table comes back in
    # r.tgz and goes into the package's configs/.
    export RUN='name=$(python3 -c "import torch; print(torch.cuda.get_device_name().replace(\" \", \"_\"))")
table="$OUT/results/fused_moe_$name.json"
tokens="64 256 1024 16 4096 1 128 512 2048 32 8192 2 4 8 16384"
timeout -s INT 250 python3 -m kernels_moe.tune_fused_moe --experts 8 --topk 2 --hidden 4096 \
  --intermediate 14336 --tokens $tokens --out "$table" 2>&1 | grep -v "━" | tail -5
timeout -s INT 250 python3 -m kernels_moe.tune_fused_moe --experts 256 --topk 8 --hidden 7168 \
  --intermediate 2048 --tokens $tokens --out "$table" 2>&1 | grep -v "━" | tail -5'
    ;;
  tests)
    # One pytest process (the file compiles Triton kernels for many configs: past 150 s on the
    # H100 on 2026-12-05).
    export RUN='timeout -s INT -k 20 500 python3 -m pytest tests/moe/test_fused_moe.py \
  -k "not compile" -m gpu -q -p no:cacheprovider --timeout 300 2>&1 | tail -6'
    ;;
  bench)
    export BENCH=moe BENCH_OPS=fused_moe STATIC_COMPILE=none BENCH_TIMEOUT=150
    export PROFILE="sampling:min_p_renorm_probs:1,128256:float32 \
      layernorm:fused_add_rmsnorm:64,8192:bfloat16 layernorm:layernorm:8192,4096:bfloat16 \
      diffusion:group_norm_silu:1,128,20,256,256:bfloat16 \
      quantization:hadamard_transform:32768,4096:bfloat16 \
      memory:copy_blocks:1024,4,16384:bfloat16 diffusion:timestep_embedding:16384,512:float32"
    # The ops that the eighteenth session changed, beside their peers (static torch.compile at
    # the target shapes, Liger), for the issues' tables (A/Bs alone gave no peer figures).
    export RUN='timeout -s INT 240 python3 -m shared.bench.run --group memory --group diffusion \
  --group layernorm --op alloc_decode --op layernorm_scale_shift --op group_norm_silu \
  --op layernorm --static-compile targets --out "$OUT/results/landed" 2>&1 | grep -v "━" | tail -60'
    ;;
  decode)
    # speculative under --static-compile large: under targets it stopped on an H100 (2026-12-05)
    # with "operation failed due to a previous error during capture" after a failed capture.
    export RUN="$HELPERS"'t 60 tests/memory/test_alloc.py
timeout -s INT 90 python3 -m shared.bench.ab run --group memory --op alloc_extend 2>&1 | grep -v "━" | tail -8
t 60 tests/layernorm/test_layernorm.py -k "cuda and 2900"
t 50 tests/diffusion/test_cuda_backends.py -k "layernorm_scale_shift and (1500 or 2900)"
sweep 100 memory targets
sweep 60 grammar targets
sweep 120 speculative large
sweep 200 sampling targets'
    ;;
  last)
    export RUN="$HELPERS"'sweep 150 diffusion targets
sweep 170 attention targets --op decode_attention
sweep 150 mamba targets'
    ;;
  *)
    echo "calls.sh: tests, bench, tune, decode or last" >&2
    exit 2
    ;;
esac
timeout -k 10 -s INT "${CALL_LIMIT:-560}" bash shared/bench/gpu_session.sh >"$OUT/session.log" 2>&1
status=$?
mkdir -p "$OUT/t"
tar czf "$OUT/t/r.tgz" -C "$OUT" results session.log 2>/dev/null
rm -rf "$OUT/results" "$OUT/session.log" "$OUT/results.tar.gz"
echo "pending call $1: gpu_session exit $status"
exit $status
