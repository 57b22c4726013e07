#!/usr/bin/env bash
# One GPU session from a source checkout: environment, GPU tests, `kernels-ops check`, benchmarks.
# Results (logs, JSON, markdown, plots) are packed into $OUT/results.tar.gz. Bring back that
# tarball, not the results folder: the device tool returns only a few files from $OUT (a run of
# 2026-12-03 lost its JSON and plots that way).
#
#   TESTS="tests/elementwise" [TESTS_K="not compile"] BENCH="elementwise" [QUICK=1] \
#     [SANITIZE="tests/x.py::t"] [BENCH_TIMEOUT=seconds] [KERNELS_COMMIT=abc1234] \
#     [STATIC_COMPILE=targets|large|all|none] [PREBUILD="group ..."] [BENCH_OPS="op ..."] \
#     shared/bench/gpu_session.sh
#
# PREBUILD builds those groups' CUDA modules first, 16 at a time (`kernels-jit build`): the tests
# and benchmarks then load them from the cache instead of building one after another.
#
# STATIC_COMPILE (run.py --static-compile, default targets): the shapes where the torch_compile
# peer compiles a static graph of its own (~2 s of host time each on the H200's host). `targets`
# (tokens 8192/32768 and <= 128) over the full grid of all three groups is most of the ~270
# shapes: give it a command of its own per group, or QUICK=1, or `large`, within the 10 minutes.
#
# FlashInfer peer: built here (no GPU) by `python -m shared.bench.build_flashinfer_peer` into the
# ignored .peers/flashinfer/ (flashinfer_norm_act.so, ~2 MB, flashinfer_sampling.so, ~3 MB,
# flashinfer_decode.so, ~1.5 MB, and their .json); name `.peers/flashinfer` in the device tool's
# `carry` list (not .peers/build: its wheels, sources and objects, ~160 MB). Where a library is
# there (or in the folder KERNELS_PEER_FLASHINFER names), the benchmarks time it; it needs
# libtvm_ffi.so, which is put on LD_LIBRARY_PATH below (the carried apache-tvm-ffi wheel,
# installed in /tmp/site).
#
# TESTS_FILE=<file>: one pytest process per line of it (paths and options), all run at once.
# TESTS_K is pytest's -k expression. Run the tests in one process: with pytest-xdist (-n 8) the
# three groups' GPU tests had reached 32% after 10 minutes, where one process runs them all in
# about 6.5 (2026-12-02; likely each worker's inductor compile pool for the torch.compile tests).
# TESTS_JOBS=2 or 3 deals the TESTS paths to that many pytest processes (gpu-tests-<j>.xml/.log):
# a few processes of whole groups, not xdist's per-test workers (not yet timed on the H200).
#
# PRECOMPILE="group ..." compiles those groups' torch_compile peers (only BENCH_OPS's, if set) in
# background processes from the start (shared/bench/precompile.py: references whose inductor compile takes minutes); the
# benchmarks wait for it and then find the graphs in inductor's caches.
#
# PROFILE="group:op:shape[:dtype[:impl]] ..." (shape comma-separated, e.g.
# mamba:selective_state_update:64,80,64,128:bfloat16) runs each case under ncu
# (shared/bench/profile_op.py: the suite's own inputs and call, no CUDA graph) with the sections
# that say why a kernel is short of bandwidth; reports land in profile-<n>.txt.
#
# AB="group ..." [AB_OPS="op ..."] runs `python -m shared.bench.ab run` (each group's CUDA kernels
# of .ab/ab_<group>, prepared here with `python -m shared.bench.ab prepare --base <rev> --group
# <group>` and carried, timed interleaved against the tree's through the suite's cases; ab.log).
#
# RUN="command" runs one more shell command after the A/Bs, in this script's environment (its
# wheels, module cache and peers): measurements no option above covers; run.log.
#
# Carried wheels (apache-tvm-ffi, liger-kernel for cp312) in .whl/ are installed first.
#
# Modules compiled here, not there (device time): the CPU machine builds them into the ignored
# .gpu/cache, named in `carry` (mind the 64 MiB: a group's modules are 1-15 MB):
#   KERNELS_CACHE_DIR=.gpu/cache python -m kernels_jit build --group G --arch sm_90a
#   KERNELS_CACHE_DIR=.gpu/cache python -m shared.bench.ab prepare --base REV --group G \
#     --build sm_90a   # the A/B's base and new modules
#   mkdir -p .gpu/pack && tar cf - -C .gpu cache | xz -T2 > .gpu/pack/cache.tar.xz  # carry .gpu/pack
# They are copied into the cache with KERNELS_PREFER_PREBUILT=1: the GPU machine's compiler is
# another g++ (another full key), so they are found by their source key and only what is
# missing is compiled (PREBUILD then builds nothing that came along).
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
# A cache packed as .gpu/pack/cache.tar.xz (unstripped modules are ~1-8 MB each; xz shrinks a
# group's ~10x, so five groups fit the carry's 64 MiB) is unpacked straight into the JIT cache
# (its members are cache/...); a carried .gpu/cache is copied there.
if [ -f .gpu/pack/cache.tar.xz ] || [ -d .gpu/cache ]; then
  mkdir -p "$KERNELS_CACHE_DIR"
  if [ -f .gpu/pack/cache.tar.xz ]; then
    tar xJf .gpu/pack/cache.tar.xz -C "$KERNELS_CACHE_DIR" --strip-components=1
  else
    cp -r .gpu/cache/. "$KERNELS_CACHE_DIR"/
  fi
  export KERNELS_PREFER_PREBUILT=1
  echo "prebuilt modules: $(find "$KERNELS_CACHE_DIR" -name '*.so' | wc -l) in $KERNELS_CACHE_DIR"
fi
# vLLM's _C in halves (shared/bench/fetch_peers.py, split_for_carry): a call carrying
# .peers/vllm-parts/<file>.1 keeps it in /tmp on the machine; the next call on that still-warm
# machine (within its 30 s idle release) carries <file>.2 and <file>.sha256, and the joined file
# becomes the vllm peer once its digest matches (2026-12-04: the tree plus the 63 MB file no
# longer fit the 64 MiB carry limit of one call).
if compgen -G ".peers/vllm-parts/*" >/dev/null; then
  PARTS=/tmp/kernels-peer-vllm-parts
  mkdir -p "$PARTS" /tmp/kernels-peer-vllm
  cp .peers/vllm-parts/* "$PARTS"/
  for first in "$PARTS"/*.1; do
    base=${first%.1}
    [ -f "$base.2" ] && [ -f "$base.sha256" ] || continue
    cat "$first" "$base.2" >"/tmp/kernels-peer-vllm/$(basename "$base")"
    if (cd /tmp/kernels-peer-vllm && sha256sum --quiet -c "$base.sha256"); then
      export KERNELS_PEER_VLLM=${KERNELS_PEER_VLLM:-/tmp/kernels-peer-vllm}
    else
      echo "vllm parts: $(basename "$base") does not match its digest (halves of two fetches?)"
      rm -f "/tmp/kernels-peer-vllm/$(basename "$base")"
    fi
  done
fi
if [ -z "${KERNELS_PEER_FLASHINFER:-}" ] && compgen -G ".peers/flashinfer/*.so" >/dev/null; then
  export KERNELS_PEER_FLASHINFER=$ROOT/.peers/flashinfer
fi
if [ -n "${KERNELS_PEER_FLASHINFER:-}" ]; then
  # The peer links libtvm_ffi.so (by soname); tvm_ffi loads it first anyway, this makes sure.
  TVM_FFI_LIB=$(python3 -c "import os, tvm_ffi; print(os.path.dirname(tvm_ffi.__file__))" \
    2>/dev/null)/lib
  export LD_LIBRARY_PATH=$TVM_FFI_LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
status=0
if [ -n "${PREBUILD:-}" ]; then
  args=()
  for g in $PREBUILD; do args+=(--group "$g"); done
  python3 -m kernels_jit build --jobs 16 "${args[@]}" 2>&1 | tail -5 | tee "$RESULTS/prebuild.log"
fi
if [ -n "${PRECOMPILE:-}" ]; then
  args=()
  for g in $PRECOMPILE; do args+=(--group "$g"); done
  [ -n "${QUICK:-}" ] && args+=(--quick)
  [ -n "${STATIC_COMPILE:-}" ] && args+=(--static-compile "$STATIC_COMPILE")
  # Only the cases the sweep will time (a run of 2026-12-04 spent its limit precompiling the
  # group's other ops).
  for o in ${BENCH_OPS:-}; do args+=(--op "$o"); done
  python3 -m shared.bench.precompile "${args[@]}" --jobs 8 >"$RESULTS/precompile.log" 2>&1 &
  PRECOMPILE_PID=$!
  export KERNELS_BENCH_PRECOMPILED="$PRECOMPILE"
fi
{
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv
  python3 -c "import torch, triton, tvm_ffi; print(torch.__version__, triton.__version__, tvm_ffi.__version__)"
  echo "flashinfer peer: ${KERNELS_PEER_FLASHINFER:-absent (no .peers/flashinfer/*.so carried)}"
  echo "static compile: ${STATIC_COMPILE:-${KERNELS_BENCH_STATIC_COMPILE:-targets}}"
} 2>&1 | tee "$RESULTS/env.txt"
gpu_tests() {  # gpu_tests <name> <paths...>: one pytest process, results as <name>.{xml,log}
  local name=$1
  shift
  # TESTS_TIMEOUT (s) interrupts pytest (SIGINT: it still reports what ran) before the call's limit.
  # A process stuck in a kernel (a hang ignores SIGINT) is killed 30 s later.
  timeout --signal=INT --kill-after=30 "${TESTS_TIMEOUT:-0}" \
    python3 -m pytest "$@" ${TESTS_K:+-k "$TESTS_K"} -m gpu -q -p no:cacheprovider -p no:logging \
    --timeout=900 --junitxml="$RESULTS/$name.xml" >"$RESULTS/$name.log" 2>&1
}
parallel_tests() {  # parallel_tests <prefix> <entry>...: one pytest process per entry, all at once
  local prefix=$1 j
  shift
  local entries=("$@") pids=()
  for j in "${!entries[@]}"; do
    eval "set -- ${entries[j]}"  # an entry's words: paths and options (-k "...")
    gpu_tests "$prefix$j" "$@" &
    pids[j]=$!
  done
  for j in "${!pids[@]}"; do
    wait "${pids[j]}"
    status=$((status | $?))
    echo "$prefix$j: ${entries[j]}"
    tail -3 "$RESULTS/$prefix$j.log"
  done
}
if [ -n "${TESTS_FILE:-}" ]; then
  # TESTS_FILE: one pytest process per line, all at once, each line its own paths and options
  # (`tests/kvcache -k bulk`; `#` lines skipped): selections that one global TESTS_K cannot say.
  entries=()
  while IFS= read -r line; do
    case $line in "" | "#"*) continue ;; esac
    entries+=("$line")
  done <"$TESTS_FILE"
  parallel_tests gpu-tests-f "${entries[@]}"
fi
if [ -n "${TESTS:-}" ]; then
  if [ "${TESTS_JOBS:-1}" -gt 1 ]; then
    # TESTS_JOBS=n: the TESTS paths dealt round-robin to n pytest processes sharing the GPU (a
    # group's tests are mostly host work and module builds; list the big groups first).
    lists=()
    i=0
    for path in $TESTS; do
      lists[i % TESTS_JOBS]+=" $path"
      i=$((i + 1))
    done
    parallel_tests gpu-tests- "${lists[@]}"
  else
    # shellcheck disable=SC2086
    gpu_tests gpu-tests $TESTS
    status=$((status | $?))
    tail -40 "$RESULTS/gpu-tests.log"
  fi
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
if [ -n "${AB:-}" ]; then
  args=()
  for g in $AB; do args+=(--group "$g"); done
  for o in ${AB_OPS:-}; do args+=(--op "$o"); done
  [ -n "${QUICK:-}" ] && args+=(--quick)
  python3 -m shared.bench.ab run "${args[@]}" 2>&1 | tee "$RESULTS/ab.log" | tail -60
  status=$((status | PIPESTATUS[0]))
fi
if [ -n "${RUN:-}" ]; then
  bash -c "$RUN" 2>&1 | tee "$RESULTS/run.log" | tail -60
  status=$((status | PIPESTATUS[0]))
fi
n=0
for target in ${PROFILE:-}; do
  IFS=: read -r group op shape dtype impl <<<"$target"
  n=$((n + 1))
  ncu --profile-from-start off --section SpeedOfLight --section MemoryWorkloadAnalysis \
    --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats \
    python3 -m shared.bench.profile_op --group "$group" --op "$op" --shape "$shape" \
    ${dtype:+--dtype "$dtype"} ${impl:+--impl "$impl"} --calls 1 >"$RESULTS/profile-$n.txt" 2>&1
  echo "profile $n ($target): exit $?; $(grep -m1 -i "DRAM Throughput" "$RESULTS/profile-$n.txt")"
done
if [ -n "${PRECOMPILE_PID:-}" ]; then
  wait "$PRECOMPILE_PID"
  grep -v "^W1\|^ " "$RESULTS/precompile.log" | tail -20
fi
if [ -n "${BENCH:-}" ]; then
  args=()
  for g in $BENCH; do args+=(--group "$g"); done
  [ -n "${QUICK:-}" ] && args+=(--quick)
  for o in ${BENCH_OPS:-}; do args+=(--op "$o"); done
  [ -n "${STATIC_COMPILE:-}" ] && args+=(--static-compile "$STATIC_COMPILE")
  # BENCH_TIMEOUT (s) stops the sweep early; the groups already finished keep their results.
  timeout --signal=INT "${BENCH_TIMEOUT:-0}" \
    python3 -m shared.bench.run "${args[@]}" --out "$RESULTS/benchmarks" 2>&1 \
    | tee "$RESULTS/bench.log" | grep -v "━" | tail -150
  status=$((status | PIPESTATUS[0]))
fi
tar czf "$OUT/results.tar.gz" -C "$OUT" results
echo "gpu_session exit status $status"
exit $status
