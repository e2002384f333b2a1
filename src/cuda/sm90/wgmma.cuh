// The wgmma layer of the sm90 mainloops: CuTe's sm90 GMMA atoms (cute/arch/mma_sm90_gmma.hpp) for
// the tile widths the kernels use, the calls that spread a thread's accumulator registers over an
// atom's operands, and the shared-memory descriptors of the ring's operand tiles.
//
// Operand tiles in a stage (TMA, 128-byte swizzle):
//   K-major   [rows][64 bf16 or 128 e4m3]: one 128-byte row per M/N index
//   MN-major  boxes of [64 k][64 m or n] bf16 (kBoxBytes), one 128-byte row per K index
// A consumer warp group's 64 rows of A start kBoxBytes * cw into the A tile in both layouts.
#pragma once
#include <cute/arch/mma_sm90_gmma.hpp>

#include <utility>

#include "src/cuda/sm90/params.h"
#include "src/cuda/sm90/ptx.cuh"

namespace mxmoe::cuda::sm90 {

constexpr cute::SM90::GMMA::Major gmma_major(Major m) {
  return m == Major::k ? cute::SM90::GMMA::Major::K : cute::SM90::GMMA::Major::MN;
}

// BF16 x BF16 -> F32, both operands from shared memory (SS): m64 nN k16.
template <int N, Major A, Major B>
struct Gmma;
template <Major A, Major B>
struct Gmma<128, A, B> {
  using Atom = cute::SM90::GMMA::MMA_64x128x16_F32BF16BF16_SS<gmma_major(A), gmma_major(B)>;
};
template <Major A, Major B>
struct Gmma<256, A, B> {
  using Atom = cute::SM90::GMMA::MMA_64x256x16_F32BF16BF16_SS<gmma_major(A), gmma_major(B)>;
};

// BF16 x BF16 -> F32 with A from registers (RS; A is K-major in registers): m64 nN k16.
template <int N, Major B>
struct GmmaRS;
template <Major B>
struct GmmaRS<128, B> {
  using Atom = cute::SM90::GMMA::MMA_64x128x16_F32BF16BF16_RS<cute::SM90::GMMA::Major::K, gmma_major(B)>;
};
template <Major B>
struct GmmaRS<256, B> {
  using Atom = cute::SM90::GMMA::MMA_64x256x16_F32BF16BF16_RS<cute::SM90::GMMA::Major::K, gmma_major(B)>;
};

// E4M3 x E4M3 -> F32, both K-major from shared memory: m64 n128 k32 (the FP8-blockwise kernels).
using GmmaFp8 = cute::SM90::GMMA::MMA_64x128x32_F32E4M3E4M3_SS_TN<>;

// acc (+)= A B: a thread's R accumulator registers (BN / 2) as the atom's R scalar operands.
template <class Atom, int R, size_t... I>
__device__ __forceinline__ void gmma_call(uint64_t da, uint64_t db, float (&acc)[R], std::index_sequence<I...>) {
  Atom::fma(da, db, acc[I]..., cute::SM90::GMMA::ScaleOut::One);
}
template <class Atom, int R, size_t... I>
__device__ __forceinline__ void gmma_call_rs(const uint32_t (&a)[4], uint64_t db, float (&acc)[R],
                                             std::index_sequence<I...>) {
  Atom::fma(a[0], a[1], a[2], a[3], db, acc[I]..., cute::SM90::GMMA::ScaleOut::One);
}
// zero: acc = A B (scale-d 0: the first wgmma of a k-block into the FP8 kernels' partial tile).
template <class Atom, int R, size_t... I>
__device__ __forceinline__ void gmma_call_scaled(uint64_t da, uint64_t db, float (&acc)[R], bool zero,
                                                 std::index_sequence<I...>) {
  Atom::fma(da, db, acc[I]..., zero ? cute::SM90::GMMA::ScaleOut::Zero : cute::SM90::GMMA::ScaleOut::One);
}

// Descriptor of k-step kk of an operand tile starting at `tile`: K-major, 32 bytes per step (16
// bf16 or 32 e4m3), SBO 1024 (8 rows); MN-major, 16 K rows of 128 bytes per step, LBO kBoxBytes
// (the next 64 M/N values), SBO 1024 (8 k).
template <Major M>
__device__ __forceinline__ uint64_t operand_desc(const uint8_t* tile, int kk) {
  if constexpr (M == Major::k)
    return smem_desc_sw128(tile + kk * 32, 16, 1024);
  else
    return smem_desc_sw128(tile + kk * 16 * 128, kBoxBytes, 1024);
}

}  // namespace mxmoe::cuda::sm90
