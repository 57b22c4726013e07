// The API version of the kernels-jit C++ headers. Group packages are versioned separately from
// kernels-jit and compile their sources against whichever headers are installed, so every source
// states the version it needs:
//
//   #include <kernels/version.h>
//   KERNELS_REQUIRE_HEADERS_API(2);
//
// and fails to compile, with a message naming both versions, against older headers.
//
// History: 1: the first released headers. 2: one pack type (kernels::Pack), the row engine with
// op structs (rowwise.cuh), kernels::Launch and checked launches, kernels/tensor.h. 3:
// kernels::LaunchConfig (PDL, cluster and cooperative launch attributes in one place);
// rowwise::plan_registers's few_rows_min. 4: kernels::allow_dynamic_smem and
// kernels::launch_with_smem / launch_dynamic (the dynamic shared-memory opt-in in one place). 5:
// kernels::cooperative_supported. 6: rowwise::RowShape::inv_hidden (set by launch_plan);
// rowwise::layernorm_finish takes the RowShape. 7: kernels/cluster.cuh (the cluster barrier in
// two halves: kernels::cluster_arrive_relaxed, cluster_arrive, cluster_wait). 8: split rows in
// the row engine (rowwise::RowShape::split and slice, RowOp::kSplitRows, row_split, plan_split,
// Plan::split and slice; row_registers's kSplit); cluster.cuh's push exchange
// (kernels::push_barrier_init, cluster_push, push_barrier_wait). 9: kernels/bulk.cuh (TMA bulk
// copies, their mbarriers and L2 policies: kernels::shared_address, l2_evict_first,
// l2_evict_last, mbarrier_init, mbarrier_init_fence, mbarrier_expect_tx, mbarrier_wait,
// bulk_load, bulk_store, bulk_commit, bulk_wait_read). 10: the late-load register kernel chosen
// per launch (rowwise::RowOp::kLateByLaunch and late_rows, row_registers's kLate,
// rowwise::late_loads_pay and rows_past_held_waves); kernels::dram_gbps; kernels::mbarrier_test.
#pragma once

#define KERNELS_HEADERS_API 10

#define KERNELS_STRINGIFY_(x) #x
#define KERNELS_STRINGIFY(x) KERNELS_STRINGIFY_(x)

// At namespace scope, once per source file.
#define KERNELS_REQUIRE_HEADERS_API(version)                                                   \
  static_assert(KERNELS_HEADERS_API >= (version),                                           \
                "this source needs the kernels-jit C++ headers API " #version                \
                " or newer, but the installed kernels-jit provides API " KERNELS_STRINGIFY(  \
                    KERNELS_HEADERS_API) ": upgrade kernels-jit")
