// cuda_sm100 (issue 13): Blackwell MXFP8 grouped GEMMs on CUTLASS 4.2's sm100 block-scaled
// ptr-array kernels (tcgen05 UTCQMMA with E8M0 scales per 32 values in tensor memory). Compiled for
// sm_100a and checked here (SASS, scale layout: tests/sm100); never run on Blackwell hardware by this
// project, and not yet in the dispatch. docs/kernels/sm100.md.
//
// Per-group problem shapes live on the device (GroupProblemShape with no host copy): one small
// prepare kernel per call turns the device token counts into the per-group pointers, strides and
// scale-factor layouts the kernel reads; the kernel's scheduler scans the shapes on the device.
// Scale factors per group follow Sm1xxBlockScaledConfig<32> (the cuBLAS / tcgen05 swizzle, our
// ScaleLayout::swizzled, tests/sm100/test_sm100_layout.cu): each group's matrix starts at its own
// 128 x 4 tile, rows padded to 128 and K-blocks to 4.
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
// layouts (RowMajor A / ColumnMajor B: K-major; ColumnMajor A / RowMajor B: MN-major, the wgrad),
// D RowMajor ElementD_, no C.
template <class LayoutA_, class LayoutB_, class ElementD_, class MmaTileShape, class ClusterShape, class KernelSchedule,
          class EpilogueSchedule>
struct GroupedConfig {
  using LayoutA = LayoutA_;
  using LayoutB = LayoutB_;
  using LayoutD = cutlass::layout::RowMajor;
  using ElementC = void;
  using ElementD = ElementD_;
  static constexpr int AlignmentA = 16;  // 128 bit of e4m3
  static constexpr int AlignmentB = 16;
  static constexpr int AlignmentC = 128 / cutlass::sizeof_bits<ElementD>::value;  // C is void: use D's
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
  using StrideD = typename GemmKernel::InternalStrideD;
  using LayoutSFA = typename CollectiveMainloop::InternalLayoutSFA;
  using LayoutSFB = typename CollectiveMainloop::InternalLayoutSFB;
  using Sm1xxBlkScaledConfig = typename CollectiveMainloop::Sm1xxBlkScaledConfig;
  using ElementSF = typename GemmKernel::ElementSF;
  using ElementAData = typename Gemm::ElementA;  // float_e4m3_t
  using ElementBData = typename Gemm::ElementB;
  using ElementDOut = typename Gemm::EpilogueOutputOp::ElementOutput;
};

// Device-side per-call argument arrays, all [num_groups].
template <class Cfg>
struct GroupedDeviceArgs {
  UnderlyingShape* problem_sizes;
  typename Cfg::ElementAData const** ptr_A;
  typename Cfg::ElementBData const** ptr_B;
  typename Cfg::ElementSF const** ptr_SFA;
  typename Cfg::ElementSF const** ptr_SFB;
  typename Cfg::ElementDOut** ptr_D;
  typename Cfg::StrideA* stride_A;
  typename Cfg::StrideB* stride_B;
  typename Cfg::StrideD* stride_D;
  typename Cfg::LayoutSFA* layout_SFA;
  typename Cfg::LayoutSFB* layout_SFB;
};

template <class Cfg>
cutlass::Status run_grouped(GroupedDeviceArgs<Cfg> const& d, int num_groups, int sm_count, void* workspace,
                            size_t workspace_bytes, cudaStream_t stream, dim3 cluster = dim3(1, 1, 1)) {
  using Gemm = typename Cfg::Gemm;
  typename Gemm::Arguments args;
  cutlass::KernelHardwareInfo hw;
  hw.device_id = 0;
  hw.sm_count = sm_count;
  hw.cluster_shape = cluster;
  hw.cluster_shape_fallback = cluster;

  decltype(args.epilogue.thread) fusion{};
  fusion.alpha = 1.0f;
  fusion.beta = 0.0f;
  fusion.alpha_ptr = nullptr;
  fusion.beta_ptr = nullptr;
  fusion.alpha_ptr_array = nullptr;
  fusion.beta_ptr_array = nullptr;
  fusion.dAlpha = {_0{}, _0{}, 0};
  fusion.dBeta = {_0{}, _0{}, 0};

  args = typename Gemm::Arguments{
      cutlass::gemm::GemmUniversalMode::kGrouped,
      {num_groups, d.problem_sizes, /*host_problem_shapes=*/nullptr},
      {d.ptr_A, d.stride_A, d.ptr_B, d.stride_B, d.ptr_SFA, d.layout_SFA, d.ptr_SFB, d.layout_SFB},
      {fusion, /*ptr_C=*/nullptr, /*dC=*/nullptr, d.ptr_D, d.stride_D},
      hw};

  Gemm gemm;
  if (Gemm::get_workspace_size(args) > workspace_bytes) return cutlass::Status::kErrorWorkspaceNull;
  cutlass::Status s = gemm.can_implement(args);
  if (s != cutlass::Status::kSuccess) return s;
  s = gemm.initialize(args, workspace, stream);
  if (s != cutlass::Status::kSuccess) return s;
  return gemm.run(stream);
}

// ---- m-grouped (fprop, dgrad) ----
// m-grouped MXFP8 GEMM: D[t, n] = sum_k A[t, k] * B_e[n, k] for the tokens t of expert e.
// CUTLASS view, per group g = e: M = m_e (tokens), N = n, K = k.
//   A: RowMajor (K-major) [m_e, K] slice of the token matrix, B_e: ColumnMajor (K-major) [N, K],
//   D: RowMajor bf16 [m_e, N], no C (ElementC = void).
using MGrouped1Sm =
    GroupedConfig<cutlass::layout::RowMajor, cutlass::layout::ColumnMajor, cutlass::bfloat16_t, Shape<_128, _256, _128>,
                  Shape<_1, _1, _1>, cutlass::gemm::KernelPtrArrayTmaWarpSpecialized1SmBlockScaledSm100,
                  cutlass::epilogue::PtrArrayTmaWarpSpecialized1Sm>;
// 2SM: 256 x 256 x 128 MMA tile over a 2x1x1 cluster (the pair of SMs shares one MMA).
using MGrouped2Sm =
    GroupedConfig<cutlass::layout::RowMajor, cutlass::layout::ColumnMajor, cutlass::bfloat16_t, Shape<_256, _256, _128>,
                  Shape<_2, _1, _1>, cutlass::gemm::KernelPtrArrayTmaWarpSpecialized2SmBlockScaledSm100,
                  cutlass::epilogue::PtrArrayTmaWarpSpecialized2Sm>;
template <class Cfg>
using MGroupedDeviceArgs = GroupedDeviceArgs<Cfg>;

// One block, one thread per group (E <= 1024): exclusive scan of the token counts, then every
// per-group pointer / stride / scale layout. A [T, K] e4m3 row-major, SFA laid out per group
// (group g's scale block starts at sum_{h<g} roundup(m_h,128) * roundup(K/32,4) bytes),
// B [E, N, K] e4m3, SFB [E] x roundup(N,128)*roundup(K/32,4), D [T, N] bf16.
template <class Cfg>
__global__ void mgrouped_prepare(MGroupedDeviceArgs<Cfg> a, int const* counts, int num_groups, int N, int K,
                                 typename Cfg::ElementAData const* A, typename Cfg::ElementSF const* SFA,
                                 typename Cfg::ElementBData const* B, typename Cfg::ElementSF const* SFB,
                                 typename Cfg::ElementDOut* D) {
  __shared__ int64_t row_off[1025], sf_off[1025];
  int g = threadIdx.x;
  int64_t const kpad = (int64_t)((K / 32 + 3) / 4 * 4);
  if (g == 0) {
    row_off[0] = 0;
    sf_off[0] = 0;
    for (int h = 0; h < num_groups; ++h) {  // one thread scans (E <= 1024 groups); a block scan is next
      row_off[h + 1] = row_off[h] + counts[h];
      sf_off[h + 1] = sf_off[h] + (int64_t)(counts[h] + 127) / 128 * 128 * kpad;
    }
  }
  __syncthreads();
  if (g >= num_groups) return;
  int m = counts[g];
  a.problem_sizes[g] = UnderlyingShape{m, N, K};
  a.ptr_A[g] = A + row_off[g] * K;
  a.ptr_SFA[g] = SFA + sf_off[g];
  a.ptr_B[g] = B + (int64_t)g * N * K;
  a.ptr_SFB[g] = SFB + (int64_t)g * ((N + 127) / 128 * 128) * kpad;
  a.ptr_D[g] = D + row_off[g] * N;
  a.stride_A[g] = cutlass::make_cute_packed_stride(typename Cfg::StrideA{}, {m, K, 1});
  a.stride_B[g] = cutlass::make_cute_packed_stride(typename Cfg::StrideB{}, {N, K, 1});
  a.stride_D[g] = cutlass::make_cute_packed_stride(typename Cfg::StrideD{}, {m, N, 1});
  a.layout_SFA[g] = Cfg::Sm1xxBlkScaledConfig::tile_atom_to_shape_SFA(cute::make_shape(m, N, K, 1));
  a.layout_SFB[g] = Cfg::Sm1xxBlkScaledConfig::tile_atom_to_shape_SFB(cute::make_shape(m, N, K, 1));
}

template <class Cfg>
cutlass::Status run_mgrouped(MGroupedDeviceArgs<Cfg> const& d, int num_groups, int sm_count, void* workspace,
                             size_t workspace_bytes, cudaStream_t stream, dim3 cluster = dim3(1, 1, 1)) {
  return run_grouped<Cfg>(d, num_groups, sm_count, workspace, workspace_bytes, stream, cluster);
}

// ---- k-grouped (wgrad) ----
// k-grouped MXFP8 GEMM (weight gradient): D_e[m, n] = sum_{t in expert e} A[t, m] * B[t, n].
// CUTLASS view, per group g = e: M = m, N = n, K = t_e (the expert's token count, may be ragged).
//   A: [t_e, M] slice, M contiguous  -> CUTLASS A (M,K) MN-major = layout::ColumnMajor
//   B: [t_e, N] slice, N contiguous  -> CUTLASS B (N,K) MN-major = layout::RowMajor
//   scales: one per 32 tokens (along K), D_e: fp32 RowMajor [M, N], no C.
using KGrouped1Sm =
    GroupedConfig<cutlass::layout::ColumnMajor, cutlass::layout::RowMajor, float, Shape<_128, _128, _128>,
                  Shape<_1, _1, _1>, cutlass::gemm::KernelPtrArrayTmaWarpSpecialized1SmBlockScaledSm100,
                  cutlass::epilogue::PtrArrayTmaWarpSpecialized1Sm>;
template <class Cfg>
using KGroupedDeviceArgs = GroupedDeviceArgs<Cfg>;

// A [T, M] e4m3, B [T, N] e4m3 (token-major), column-wise scales per group: group g's scale chunk
// starts at scale row s_g = sum_{h<g} roundup(ceil(t_h/32), 4); row width roundup(M,128) (SFA) or
// roundup(N,128) (SFB). D [E, M, N] fp32.
template <class Cfg>
__global__ void kgrouped_prepare(KGroupedDeviceArgs<Cfg> a, int const* counts, int num_groups, int M, int N,
                                 typename Cfg::ElementAData const* A, typename Cfg::ElementSF const* SFA,
                                 typename Cfg::ElementBData const* B, typename Cfg::ElementSF const* SFB,
                                 typename Cfg::ElementDOut* D) {
  __shared__ int64_t t_off[1025], s_off[1025];
  int g = threadIdx.x;
  if (g == 0) {
    t_off[0] = 0;
    s_off[0] = 0;
    for (int h = 0; h < num_groups; ++h) {
      t_off[h + 1] = t_off[h] + counts[h];
      s_off[h + 1] = s_off[h] + ((counts[h] + 31) / 32 + 3) / 4 * 4;
    }
  }
  __syncthreads();
  if (g >= num_groups) return;
  int k = counts[g];
  // K = 0: CUTLASS 4.2 schedules the group's tiles and stores accumulators nothing cleared
  // (NVIDIA/cutlass #2674, fixed after 4.2.0); with M = 0 no tile is scheduled, and the caller
  // writes D_e's zeros (beta 0) or leaves it (beta 1), as the other backends do.
  a.problem_sizes[g] = UnderlyingShape{k == 0 ? 0 : M, N, k};
  a.ptr_A[g] = A + t_off[g] * M;
  a.ptr_B[g] = B + t_off[g] * N;
  a.ptr_SFA[g] = SFA + s_off[g] * ((M + 127) / 128 * 128);
  a.ptr_SFB[g] = SFB + s_off[g] * ((N + 127) / 128 * 128);
  a.ptr_D[g] = D + (int64_t)g * M * N;
  a.stride_A[g] = cutlass::make_cute_packed_stride(typename Cfg::StrideA{}, {M, k, 1});
  a.stride_B[g] = cutlass::make_cute_packed_stride(typename Cfg::StrideB{}, {N, k, 1});
  a.stride_D[g] = cutlass::make_cute_packed_stride(typename Cfg::StrideD{}, {M, N, 1});
  a.layout_SFA[g] = Cfg::Sm1xxBlkScaledConfig::tile_atom_to_shape_SFA(cute::make_shape(M, N, k, 1));
  a.layout_SFB[g] = Cfg::Sm1xxBlkScaledConfig::tile_atom_to_shape_SFB(cute::make_shape(M, N, k, 1));
}

template <class Cfg>
cutlass::Status run_kgrouped(KGroupedDeviceArgs<Cfg> const& d, int num_groups, int sm_count, void* workspace,
                             size_t workspace_bytes, cudaStream_t stream) {
  return run_grouped<Cfg>(d, num_groups, sm_count, workspace, workspace_bytes, stream, dim3(1, 1, 1));
}

}  // namespace mxmoe::cuda::sm100
