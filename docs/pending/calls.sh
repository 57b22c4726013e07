#!/usr/bin/env bash
# The pending patches' device calls (README.md), on the GPU machine from the repository root of
# wip/pending (main + docs/pending/*.mbox); each writes $OUT/t/r.tgz (results + session.log):
#   bash docs/pending/calls.sh tests  # GPU tests of 02 + 17 (layernorm, rmsnorm), 15 (fused_a and
#                                     # its switches), 16 (fused_moe), 18 (layernorm_scale_shift),
#                                     # 19 (group_norm_silu's staged kernel), 20 (alloc_decode)
#   bash docs/pending/calls.sh ab     # the A/B against main: the norms in bf16 (17) and fp16 (02),
#                                     # layernorm_scale_shift (18), alloc_decode (20)
#   bash docs/pending/calls.sh bench  # fused_a's and group_norm_silu's switches timed (19's staged
#                                     # kernel, the streamed lag), fused_moe beside vLLM's Triton
#                                     # kernel, ncu profiles of five misses
#   bash docs/pending/calls.sh core   # one call where only one comes: the tests of 02 + 17
#                                     # (1000-row shapes: the 8-vector kernels), 18 and 20, then
#                                     # their A/Bs
#   bash docs/pending/calls.sh rest   # after core, in what device time is left (CALL_LIMIT): 19's
#                                     # tests and switches, 15's tests and switches, 16's tests
#   bash docs/pending/calls.sh tune   # on a GPU without a fused_moe table (an H100): tunes the two
#                                     # model shapes into results/fused_moe_<device>.json (~8 min)
# carry: .whl; .gpu/pack (if rebuilt for this stack); .ab for ab (`python -m shared.bench.ab
# prepare --base main --group layernorm --group diffusion --group memory`); .peers/vllm_fused_moe
# for bench.
# The tests run one pytest process after another: eight processes sharing the GPU at once made
# each test 10-50x slower on 2026-12-05. CALL_LIMIT (s, default 560) bounds the session so that its
# results are packed within the device tool's limit.
set -uo pipefail
: "${OUT:?the device tool sets OUT}"
export OUT
export KERNELS_COMMIT=${KERNELS_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
# The commands below, as the RUN script's helpers: t <limit> <pytest args> (the GPU tests, their
# last lines), ab <limit> <ab run args> (an A/B against main), sw <limit> <switches args>.
HELPERS='t() { timeout -s INT -k 20 "$1" python3 -m pytest "${@:2}" -m gpu -q \
    -p no:cacheprovider --timeout 200 2>&1 | tail -4; }
ab() { timeout -s INT "$1" python3 -m shared.bench.ab run "${@:2}"; }
sw() { timeout -s INT "$1" python3 -m shared.bench.switches "${@:2}"; }
'
GNS_SWITCHES='sw 90 --group diffusion --op group_norm_silu --setting staged:_STAGED_MIN_BYTES=0 \
  --setting lag0:_STREAM_LAG_EIGHTHS=0 --setting lag8:_STREAM_LAG_EIGHTHS=8 \
  --setting twopass:_STREAM_MIN_BYTES=-1
'
FUSED_A_SWITCHES='sw 90 --group gemm --op dsv3_fused_a_gemm \
  --setting old:_RING_MAX_M=0,_CLUSTER_PUSH=False,_WEIGHT_FIRST=False
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
    export RUN=$HELPERS'
t 110 tests/layernorm/test_layernorm.py -k "not compile and (fp32_weight or layouts or matches_reference)"
t 100 tests/layernorm/test_rmsnorm.py -k "not compile and (1000x or layouts or graph or pdl)"
t 90 tests/gemm/test_dsv3_fused_a_gemm.py tests/gemm/test_small_m_switches.py -k "not compile"
t 50 tests/moe/test_fused_moe.py -k "not compile"
t 60 tests/diffusion/test_cuda_backends.py -k "layernorm_scale_shift or graph"
t 100 tests/diffusion/test_group_norm_silu.py -k "staged or streamed or offset"
t 40 tests/memory/test_alloc.py -k "cuda"'
    ;;
  core)
    export RUN=$HELPERS'
t 60 tests/layernorm/test_layernorm.py -k "not compile and 1000x"
t 60 tests/layernorm/test_rmsnorm.py -k "not compile and 1000x"
t 45 tests/diffusion/test_cuda_backends.py -k "layernorm_scale_shift"
t 25 tests/memory/test_alloc.py -k "cuda"
ab 150 --group layernorm --op layernorm --op rmsnorm --op fused_add_rmsnorm
ab 80 --group diffusion --op layernorm_scale_shift
ab 50 --group memory --op alloc_decode
KERNELS_BENCH_DTYPE=float16 ab 70 --group layernorm --op layernorm'
    ;;
  rest)
    export RUN=$HELPERS'
t 100 tests/diffusion/test_group_norm_silu.py -k "staged or streamed or offset"
'$GNS_SWITCHES'
t 90 tests/gemm/test_dsv3_fused_a_gemm.py tests/gemm/test_small_m_switches.py -k "not compile"
'$FUSED_A_SWITCHES'
t 50 tests/moe/test_fused_moe.py -k "not compile"'
    ;;
  ab)
    export RUN=$HELPERS'
ab 150 --group layernorm --op layernorm --op rmsnorm --op fused_add_rmsnorm
ab 90 --group diffusion --op layernorm_scale_shift
ab 60 --group memory --op alloc_decode
KERNELS_BENCH_DTYPE=float16 ab 90 --group layernorm --op layernorm'
    ;;
  bench)
    export BENCH=moe BENCH_OPS=fused_moe STATIC_COMPILE=none BENCH_TIMEOUT=150
    export PROFILE="sampling:min_p_renorm_probs:1,128256:float32 \
      layernorm:fused_add_rmsnorm:64,8192:bfloat16 layernorm:layernorm:8192,4096:bfloat16 \
      diffusion:layernorm_scale_shift:1,32760,3072:bfloat16 \
      diffusion:group_norm_silu:1,128,20,256,256:bfloat16"
    export RUN=$HELPERS$FUSED_A_SWITCHES$GNS_SWITCHES
    ;;
  *)
    echo "calls.sh: tests, ab, bench, core, rest or tune" >&2
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
