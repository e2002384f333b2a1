// cuda_sm100 (issue 13): Blackwell MXFP8 grouped GEMMs on CUTLASS 4.2's sm100 block-scaled
// ptr-array kernels (tcgen05 UTCQMMA with E8M0 scales per 32 values in tensor memory). Compiled for
// sm_100a and checked here (SASS, scale layout: tests/sm100); never run on Blackwell hardware by this
// project. docs/kernels/sm100.md.
//
// Per-group problem shapes live on the device (GroupProblemShape with no host copy): one small
// prepare kernel per call turns the device group schedule into the per-group pointers, strides and
// scale-factor layouts the kernel reads; the kernel's scheduler scans the shapes on the device.
// Scale factors per group follow Sm1xxBlockScaledConfig<32> (the cuBLAS / tcgen05 swizzle, our
// ScaleLayout::swizzled, tests/sm100/test_sm100_layout.cu): each group's matrix starts at its own
// 128 x 4 tile, rows padded to 128 and K-blocks to 4; the host entries (gemm.cu) repack mxmoe's
// scales into that layout first (grouped_operands.cu, scale_repack.h).
#pragma once
#include <cuda_runtime.h>

#include <cutlass/cutlass.h>
#include <cutlass/epilogue/thread/linear_combination.h>
#include <cutlass/gemm/device/gemm_universal_adapter.h>
#include <cutlass/numeric_types.h>
#include <cstdint>
#include <cute/tensor.hpp>
#include <cutlass/detail/sm100_blockscaled_layout.hpp>
#include <cutlass/epilogue/collective/collective_builder.hpp>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/gemm/dispatch_policy.hpp>
#include <cutlass/gemm/group_array_problem_shape.hpp>
#include <cutlass/gemm/kernel/gemm_universal.hpp>
#include <cutlass/util/packed_stride.hpp>
#include <string>
#include <type_traits>

#include "src/cuda/common/check.h"
#include "src/cuda/common/workspace.h"
#include "src/cuda/sm100/kernels.h"
#include "src/cuda/sm100/scale_repack.h"

namespace mxmoe::cuda::sm100 {
using namespace cute;

// Per-group <M,N,K>, read by the kernel from device memory (host copy may be nullptr).
using ProblemShape = cutlass::gemm::GroupProblemShape<Shape<int, int, int>>;
using UnderlyingShape = ProblemShape::UnderlyingProblemShape;

using ElementA = cutlass::mx_float8_t<cutlass::float_e4m3_t>;  // e4m3 data + ue8m0 scale, vec 32
using ElementB = cutlass::mx_float8_t<cutlass::float_e4m3_t>;
using ElementAccumulator = float;
using ArchTag = cutlass::arch::Sm100;
using OperatorClass = cutlass::arch::OpClassBlockScaledTensorOp;

// One configuration of CUTLASS's sm100 block-scaled ptr-array GEMM: A and B MXFP8 with the given
// layouts (RowMajor A / ColumnMajor B: K-major; ColumnMajor A / RowMajor B: MN-major), D RowMajor
// ElementD_, C either void (D = acc) or ElementD_ read through the same pointers as D (beta 1).
template <class LayoutA_, class LayoutB_, class ElementC_, class ElementD_, class MmaTileShape_, class ClusterShape_,
          class KernelSchedule, class EpilogueSchedule>
struct GroupedConfig {
  using LayoutA = LayoutA_;
  using LayoutB = LayoutB_;
  using LayoutD = cutlass::layout::RowMajor;
  using ElementC = ElementC_;
  using ElementD = ElementD_;
  using MmaTileShape = MmaTileShape_;
  using ClusterShape = ClusterShape_;
  static_assert(std::is_void_v<ElementC> || std::is_same_v<ElementC, ElementD>, "C, where read, is D itself");
  static constexpr int AlignmentA = 16;  // 128 bit of e4m3
  static constexpr int AlignmentB = 16;
  static constexpr int AlignmentC = 128 / cutlass::sizeof_bits<ElementD>::value;  // C is void or D
  static constexpr int AlignmentD = 128 / cutlass::sizeof_bits<ElementD>::value;

  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      ArchTag, OperatorClass, MmaTileShape, ClusterShape, cutlass::epilogue::collective::EpilogueTileAuto,
      ElementAccumulator, ElementAccumulator, ElementC, LayoutD*, AlignmentC, ElementD, LayoutD*, AlignmentD,
      EpilogueSchedule>::CollectiveOp;

  using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      ArchTag, OperatorClass, ElementA, LayoutA*, AlignmentA, ElementB, LayoutB*, AlignmentB, ElementAccumulator,
      MmaTileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename CollectiveEpilogue::SharedStorage))>,
      KernelSchedule>::CollectiveOp;

  using GemmKernel = cutlass::gemm::kernel::GemmUniversal<ProblemShape, CollectiveMainloop, CollectiveEpilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<GemmKernel>;

  using StrideA = typename GemmKernel::InternalStrideA;
  using StrideB = typename GemmKernel::InternalStrideB;
  using StrideC = typename GemmKernel::InternalStrideC;
  using StrideD = typename GemmKernel::InternalStrideD;
  using LayoutSFA = typename CollectiveMainloop::InternalLayoutSFA;
  using LayoutSFB = typename CollectiveMainloop::InternalLayoutSFB;
  using Sm1xxBlkScaledConfig = typename CollectiveMainloop::Sm1xxBlkScaledConfig;
  using ElementSF = typename GemmKernel::ElementSF;
  using ElementAData = typename Gemm::ElementA;  // float_e4m3_t
  using ElementBData = typename Gemm::ElementB;
  using ElementDOut = typename Gemm::EpilogueOutputOp::ElementOutput;
  using ElementCArg = typename CollectiveEpilogue::ElementC;  // what the epilogue's ptr_C points to (void: none)
  static constexpr bool kReadsC = !std::is_void_v<ElementC>;
  static constexpr int kClusterM = size<0>(ClusterShape{});
};

// Device-side per-call argument arrays, all [num_groups] (ptr_C / stride_C only where C is read).
template <class Cfg>
struct GroupedDeviceArgs {
  UnderlyingShape* problem_sizes = nullptr;
  typename Cfg::ElementAData const** ptr_A = nullptr;
  typename Cfg::ElementBData const** ptr_B = nullptr;
  typename Cfg::ElementSF const** ptr_SFA = nullptr;
  typename Cfg::ElementSF const** ptr_SFB = nullptr;
  typename Cfg::ElementCArg const** ptr_C = nullptr;
  typename Cfg::ElementDOut** ptr_D = nullptr;
  typename Cfg::StrideA* stride_A = nullptr;
  typename Cfg::StrideB* stride_B = nullptr;
  typename Cfg::StrideC* stride_C = nullptr;
  typename Cfg::StrideD* stride_D = nullptr;
  typename Cfg::LayoutSFA* layout_SFA = nullptr;
  typename Cfg::LayoutSFB* layout_SFB = nullptr;
};

template <class Cfg>
int64_t device_args_bytes(int64_t groups) {
  using D = GroupedDeviceArgs<Cfg>;
  auto piece = [&](auto* p) { return Workspace::aligned(groups * static_cast<int64_t>(sizeof(*p))); };
  D d;
  return piece(d.problem_sizes) + piece(d.ptr_A) + piece(d.ptr_B) + piece(d.ptr_SFA) + piece(d.ptr_SFB) +
         (Cfg::kReadsC ? piece(d.ptr_C) + piece(d.stride_C) : 0) + piece(d.ptr_D) + piece(d.stride_A) +
         piece(d.stride_B) + piece(d.stride_D) + piece(d.layout_SFA) + piece(d.layout_SFB);
}

template <class Cfg>
GroupedDeviceArgs<Cfg> take_device_args(Workspace& ws, int64_t groups) {
  GroupedDeviceArgs<Cfg> d;
  auto take = [&](auto*& p) {
    using T = std::remove_pointer_t<std::remove_reference_t<decltype(p)>>;
    p = ws.take<T>(groups);
  };
  take(d.problem_sizes);
  take(d.ptr_A);
  take(d.ptr_B);
  take(d.ptr_SFA);
  take(d.ptr_SFB);
  if constexpr (Cfg::kReadsC) {
    take(d.ptr_C);
    take(d.stride_C);
  }
  take(d.ptr_D);
  take(d.stride_A);
  take(d.stride_B);
  take(d.stride_D);
  take(d.layout_SFA);
  take(d.layout_SFB);
  return d;
}

// CUTLASS's arguments: D = alpha acc + beta C with alpha 1, beta 0 (no C read) or 1 (C = D).
template <class Cfg>
typename Cfg::Gemm::Arguments grouped_arguments(GroupedDeviceArgs<Cfg> const& d, int num_groups, bool beta_one) {
  using Gemm = typename Cfg::Gemm;
  cutlass::KernelHardwareInfo hw;
  MXMOE_CUDA_CHECK(cudaGetDevice(&hw.device_id));
  hw.sm_count = cutlass::KernelHardwareInfo::query_device_multiprocessor_count(hw.device_id);
  hw.cluster_shape = dim3(Cfg::kClusterM, 1, 1);
  hw.cluster_shape_fallback = dim3(Cfg::kClusterM, 1, 1);

  typename Gemm::Arguments args;
  decltype(args.epilogue.thread) fusion{};
  fusion.alpha = 1.0f;
  fusion.beta = beta_one ? 1.0f : 0.0f;
  fusion.alpha_ptr = nullptr;
  fusion.beta_ptr = nullptr;
  fusion.alpha_ptr_array = nullptr;
  fusion.beta_ptr_array = nullptr;
  fusion.dAlpha = {_0{}, _0{}, 0};
  fusion.dBeta = {_0{}, _0{}, 0};

  return typename Gemm::Arguments{
      cutlass::gemm::GemmUniversalMode::kGrouped,
      {num_groups, d.problem_sizes, /*host_problem_shapes=*/nullptr},
      {d.ptr_A, d.stride_A, d.ptr_B, d.stride_B, d.ptr_SFA, d.layout_SFA, d.ptr_SFB, d.layout_SFB},
      {fusion, beta_one ? d.ptr_C : nullptr, d.stride_C, d.ptr_D, d.stride_D},
      hw};
}

inline void cutlass_check(cutlass::Status s, const char* what) {
  if (s != cutlass::Status::kSuccess)
    throw Error("cuda_sm100", std::string("CUTLASS ") + what + " failed: " + cutlassGetStatusString(s));
}

// One call: the device argument arrays and CUTLASS's workspace from one stream-ordered Workspace,
// `prepare(d)` (enqueues the prepare kernel that fills them), then the GEMM.
template <class Cfg, class Prepare>
void run_grouped(int num_groups, bool beta_one, cudaStream_t stream, Prepare&& prepare) {
  using Gemm = typename Cfg::Gemm;
  const size_t cutlass_bytes = Gemm::get_workspace_size(grouped_arguments<Cfg>({}, num_groups, beta_one));
  Workspace ws(device_args_bytes<Cfg>(num_groups) + Workspace::aligned(static_cast<int64_t>(cutlass_bytes)), stream);
  const GroupedDeviceArgs<Cfg> d = take_device_args<Cfg>(ws, num_groups);
  prepare(d);
  const typename Gemm::Arguments args = grouped_arguments<Cfg>(d, num_groups, beta_one);
  void* cutlass_ws = ws.take<uint8_t>(static_cast<int64_t>(cutlass_bytes));
  Gemm gemm;
  cutlass_check(gemm.can_implement(args), "can_implement");
  cutlass_check(gemm.initialize(args, cutlass_ws, stream), "initialize");
  cutlass_check(gemm.run(stream), "run");
  MXMOE_CUDA_CHECK_LAUNCH();
}

constexpr int kPrepareThreads = 128;  // one thread per group
inline int prepare_blocks(int groups) { return (groups + kPrepareThreads - 1) / kPrepareThreads; }

// ---- m-grouped (fprop, dgrad) ----
// m-grouped MXFP8 GEMM: D[t, n] = sum_k A[t, k] * B_e[n, k] for the tokens t of expert e.
// CUTLASS view, per group g = e: M = m_e (tokens), N = n, K = k.
//   A: RowMajor (K-major) [m_e, K] slice of the token matrix; B_e: ColumnMajor (K-major) [N, K] (fprop)
//   or RowMajor (MN-major) [K, N] (dgrad); D: RowMajor bf16 [m_e, N], no C (ElementC = void).
using MGrouped1Sm = GroupedConfig<cutlass::layout::RowMajor, cutlass::layout::ColumnMajor, void, cutlass::bfloat16_t,
                                  Shape<_128, _256, _128>, Shape<_1, _1, _1>,
                                  cutlass::gemm::KernelPtrArrayTmaWarpSpecialized1SmBlockScaledSm100,
                                  cutlass::epilogue::PtrArrayTmaWarpSpecialized1Sm>;
// dgrad: B_e stored [K, N] (the layer's weight read transposed), column-wise scales (blocks along K).
using MGroupedKn1Sm = GroupedConfig<cutlass::layout::RowMajor, cutlass::layout::RowMajor, void, cutlass::bfloat16_t,
                                    Shape<_128, _256, _128>, Shape<_1, _1, _1>,
                                    cutlass::gemm::KernelPtrArrayTmaWarpSpecialized1SmBlockScaledSm100,
                                    cutlass::epilogue::PtrArrayTmaWarpSpecialized1Sm>;

// One thread per group: pointers, strides and scale layouts of group g from the schedule (rows
// [begin, end), tile_start of 128-row tiles). A [T, K] e4m3, SFA per group at token_rows_offset,
// B [E, N, K] or [E, K, N] e4m3, SFB at expert_matrix_offset, D [T, N] bf16.
template <class Cfg>
__global__ void mgrouped_prepare(GroupedDeviceArgs<Cfg> a, MGroupedOperands op) {
  const int g = blockIdx.x * blockDim.x + threadIdx.x;
  if (g >= op.experts) return;
  const GroupInfo gi = op.groups[g];
  const int m = gi.end - gi.begin, n = op.n, k = op.k;
  a.problem_sizes[g] = UnderlyingShape{m, n, k};
  a.ptr_A[g] = reinterpret_cast<typename Cfg::ElementAData const*>(op.a) + static_cast<int64_t>(gi.begin) * k;
  a.ptr_SFA[g] = reinterpret_cast<typename Cfg::ElementSF const*>(op.sfa) + token_rows_offset(gi.tile_start, k);
  a.ptr_B[g] = reinterpret_cast<typename Cfg::ElementBData const*>(op.b) + static_cast<int64_t>(g) * n * k;
  a.ptr_SFB[g] = reinterpret_cast<typename Cfg::ElementSF const*>(op.sfb) + expert_matrix_offset(g, n, k);
  a.ptr_D[g] = reinterpret_cast<typename Cfg::ElementDOut*>(op.d) + static_cast<int64_t>(gi.begin) * n;
  a.stride_A[g] = cutlass::make_cute_packed_stride(typename Cfg::StrideA{}, {m, k, 1});
  a.stride_B[g] = cutlass::make_cute_packed_stride(typename Cfg::StrideB{}, {n, k, 1});
  a.stride_D[g] = cutlass::make_cute_packed_stride(typename Cfg::StrideD{}, {m, n, 1});
  a.layout_SFA[g] = Cfg::Sm1xxBlkScaledConfig::tile_atom_to_shape_SFA(cute::make_shape(m, n, k, 1));
  a.layout_SFB[g] = Cfg::Sm1xxBlkScaledConfig::tile_atom_to_shape_SFB(cute::make_shape(m, n, k, 1));
}

template <class Cfg>
void run_mgrouped(const MGroupedOperands& op, cudaStream_t stream) {
  if (op.experts <= 0) return;
  run_grouped<Cfg>(op.experts, /*beta_one=*/false, stream, [&](const GroupedDeviceArgs<Cfg>& d) {
    mgrouped_prepare<Cfg><<<prepare_blocks(op.experts), kPrepareThreads, 0, stream>>>(d, op);
    MXMOE_CUDA_CHECK_LAUNCH();
  });
}

// ---- k-grouped (wgrad) ----
// k-grouped MXFP8 GEMM (weight gradient): D_e[m, n] = sum_{t in expert e} A[t, m] * B[t, n] (+ D_e).
// CUTLASS view, per group g = e: M = m, N = n, K = t_e (the expert's token count, may be ragged).
//   A: [t_e, M] slice, M contiguous  -> CUTLASS A (M,K) MN-major = layout::ColumnMajor
//   B: [t_e, N] slice, N contiguous  -> CUTLASS B (N,K) MN-major = layout::RowMajor
//   scales: one per 32 tokens (along K), D_e: fp32 RowMajor [M, N]; C = D_e where beta is 1.
using KGrouped1Sm =
    GroupedConfig<cutlass::layout::ColumnMajor, cutlass::layout::RowMajor, float, float, Shape<_128, _128, _128>,
                  Shape<_1, _1, _1>, cutlass::gemm::KernelPtrArrayTmaWarpSpecialized1SmBlockScaledSm100,
                  cutlass::epilogue::PtrArrayTmaWarpSpecialized1Sm>;

// A [T, M] e4m3, B [T, N] e4m3 (token-major), column-wise scales per group at token_cols_offset
// (scale row s_g = col_chunk), D [E, M, N] fp32.
template <class Cfg>
__global__ void kgrouped_prepare(GroupedDeviceArgs<Cfg> a, KGroupedOperands op) {
  const int g = blockIdx.x * blockDim.x + threadIdx.x;
  if (g >= op.experts) return;
  const GroupInfo gi = op.groups[g];
  const int k = gi.end - gi.begin, m = op.m, n = op.n;
  // K = 0: CUTLASS 4.2 schedules the group's tiles and stores accumulators nothing cleared
  // (NVIDIA/cutlass #2674, fixed after 4.2.0); with M = 0 no tile is scheduled, and the host entry
  // writes D_e's zeros (beta 0) or leaves it (beta 1), as the other backends do.
  a.problem_sizes[g] = UnderlyingShape{k == 0 ? 0 : m, n, k};
  a.ptr_A[g] = reinterpret_cast<typename Cfg::ElementAData const*>(op.a) + static_cast<int64_t>(gi.begin) * m;
  a.ptr_B[g] = reinterpret_cast<typename Cfg::ElementBData const*>(op.b) + static_cast<int64_t>(gi.begin) * n;
  a.ptr_SFA[g] = reinterpret_cast<typename Cfg::ElementSF const*>(op.sfa) + token_cols_offset(gi.col_chunk, m);
  a.ptr_SFB[g] = reinterpret_cast<typename Cfg::ElementSF const*>(op.sfb) + token_cols_offset(gi.col_chunk, n);
  float* d = op.d + static_cast<int64_t>(g) * m * n;
  a.ptr_D[g] = d;
  a.stride_A[g] = cutlass::make_cute_packed_stride(typename Cfg::StrideA{}, {m, k, 1});
  a.stride_B[g] = cutlass::make_cute_packed_stride(typename Cfg::StrideB{}, {n, k, 1});
  a.stride_D[g] = cutlass::make_cute_packed_stride(typename Cfg::StrideD{}, {m, n, 1});
  if constexpr (Cfg::kReadsC) {
    a.ptr_C[g] = d;
    a.stride_C[g] = cutlass::make_cute_packed_stride(typename Cfg::StrideC{}, {m, n, 1});
  }
  a.layout_SFA[g] = Cfg::Sm1xxBlkScaledConfig::tile_atom_to_shape_SFA(cute::make_shape(m, n, k, 1));
  a.layout_SFB[g] = Cfg::Sm1xxBlkScaledConfig::tile_atom_to_shape_SFB(cute::make_shape(m, n, k, 1));
}

template <class Cfg>
void run_kgrouped(const KGroupedOperands& op, cudaStream_t stream) {
  if (op.experts <= 0) return;
  run_grouped<Cfg>(op.experts, op.accumulate, stream, [&](const GroupedDeviceArgs<Cfg>& d) {
    kgrouped_prepare<Cfg><<<prepare_blocks(op.experts), kPrepareThreads, 0, stream>>>(d, op);
    MXMOE_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace mxmoe::cuda::sm100
