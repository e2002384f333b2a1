// Byte transposes of FP8-blockwise operands (cuda_ops.h; layouts in fp8_block_common.cuh), for
// the sm90 FP8 GEMMs that read K-major operands:
//   transpose_token_blocks       token blocks [T, K] -> [K, Tp], each 128-row token tile to its
//                                own 128 columns (rows past its group's end as 0);
//   transpose_fp8_block_weights  E weights [rows, cols] -> [cols, rows], with their 128x128-block
//                                scales [E][rb][cb] -> [E][cb][rb].
// Both through one 128 x 128 shared-memory tile transpose with 16-byte accesses where the row
// lengths and pointers allow. Bytes are moved, never converted: exact.
// Run: <build>/tests/mxmoe_gpu_tests --gtest_filter='*Fp8Block*'
#include <string>

#include "src/common/experts.h"
#include "src/common/fp8_block.h"
#include "src/cuda/common/check.h"
#include "src/cuda/common/group_schedule.h"
#include "src/cuda/common/workspace.h"
#include "src/cuda/cuda_ops.h"
#include "src/cuda/quant/fp8_block_common.cuh"

namespace mxmoe::cuda {
using namespace fp8_block_detail;
namespace {

// ---- byte transposes: 128 x 128 tiles, 16-byte accesses ----
// The tile is read row by row (8 lanes x 16 bytes per 128-byte row piece) into shared memory as 128
// rows of 32 words, with the 16-byte group g of row r stored at group g ^ ((r / 16) % 8) (an XOR
// swizzle: the 16-byte stores stay whole and conflict-free). Thread t (lane l, warp w) then takes
// the 4 columns of word cw = l / 8 + 4 w in the 16 rows 16 (l % 8) .. + 15: those 16 words of one
// load instruction lie in 32 distinct banks (bank = cw ^ 4 (l % 8)); four 4x4 byte transposes
// (__byte_perm) give 16 bytes for each of the 4 columns, stored at [c][16 (l % 8)] of the output,
// so each store instruction writes 4 whole 128-byte output row pieces. LW / SW: the widths of the
// global loads / stores (16, 4 or 1 bytes), chosen where the row lengths and pointers allow;
// partial tiles guard whole LW / SW units (nr, nc and wr are multiples of them).
constexpr int kT = 128;  // tile rows and columns (bytes)

__device__ __forceinline__ int swz(int row) { return ((row >> 4) & 7) << 2; }  // word offset XOR

// The tile src[r * sp + c] (r < nr, c < nc; zeros elsewhere) -> dst[c * dp + r] for c < nc, r < wr.
template <int LW, int SW>
__device__ __forceinline__ void transpose_tile(const uint8_t* __restrict__ src, int64_t sp, int nr, int nc,
                                               uint8_t* __restrict__ dst, int64_t dp, int wr,
                                               uint32_t (*tile)[kT / 4]) {
#pragma unroll
  for (int j = 0; j < kT * kT / 16 / kThreads; ++j) {
    const int i = static_cast<int>(threadIdx.x) + j * kThreads, r = i / 8, g = i % 8;
    const uint8_t* p = src + r * sp + 16 * g;
    uint32_t v[4] = {0u, 0u, 0u, 0u};
    if (r < nr) {
      if constexpr (LW == 16) {
        if (16 * g < nc) {
          const uint4 u = *reinterpret_cast<const uint4*>(p);
          v[0] = u.x, v[1] = u.y, v[2] = u.z, v[3] = u.w;
        }
      } else if constexpr (LW == 4) {
#pragma unroll
        for (int h = 0; h < 4; ++h)
          if (16 * g + 4 * h < nc) v[h] = reinterpret_cast<const uint32_t*>(p)[h];
      } else {
#pragma unroll
        for (int b = 0; b < 16; ++b)
          if (16 * g + b < nc) v[b / 4] |= static_cast<uint32_t>(p[b]) << (8 * (b % 4));
      }
    }
    *reinterpret_cast<uint4*>(&tile[r][(4 * g) ^ swz(r)]) = make_uint4(v[0], v[1], v[2], v[3]);
  }
  __syncthreads();
  const int lane = threadIdx.x % 32, rb = lane % 8, cw = lane / 8 + 4 * (threadIdx.x / 32);
  uint32_t o[4][4];  // o[column j][row group h]: bytes of rows 16 rb + 4 h .. + 3 of column 4 cw + j
#pragma unroll
  for (int h = 0; h < 4; ++h) {
    const int r = 16 * rb + 4 * h;
    const uint32_t a0 = tile[r][cw ^ swz(r)], a1 = tile[r + 1][cw ^ swz(r + 1)];
    const uint32_t a2 = tile[r + 2][cw ^ swz(r + 2)], a3 = tile[r + 3][cw ^ swz(r + 3)];
    const uint32_t t0 = __byte_perm(a0, a1, 0x5140), t1 = __byte_perm(a2, a3, 0x5140);  // bytes 0, 1
    const uint32_t t2 = __byte_perm(a0, a1, 0x7362), t3 = __byte_perm(a2, a3, 0x7362);  // bytes 2, 3
    o[0][h] = __byte_perm(t0, t1, 0x5410);
    o[1][h] = __byte_perm(t0, t1, 0x7632);
    o[2][h] = __byte_perm(t2, t3, 0x5410);
    o[3][h] = __byte_perm(t2, t3, 0x7632);
  }
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int c = 4 * cw + j;
    if (c >= nc) break;
    uint8_t* p = dst + c * dp + 16 * rb;
    if constexpr (SW == 16) {
      if (16 * rb < wr) *reinterpret_cast<uint4*>(p) = make_uint4(o[j][0], o[j][1], o[j][2], o[j][3]);
    } else if constexpr (SW == 4) {
#pragma unroll
      for (int h = 0; h < 4; ++h)
        if (16 * rb + 4 * h < wr) reinterpret_cast<uint32_t*>(p)[h] = o[j][h];
    } else {
#pragma unroll
      for (int b = 0; b < 16; ++b)
        if (16 * rb + b < wr) p[b] = static_cast<uint8_t>(o[j][b / 4] >> (8 * (b % 4)));
    }
  }
}

// E e4m3 matrices [rows, cols] -> [cols, rows]: one CTA per 128 x 128 tile (blockIdx.x: column
// tile, y: row tile, z: expert); the 128x128-block scales [E][rb][cb] -> [E][cb][rb] below.
template <int LW, int SW>
__global__ void __launch_bounds__(kThreads)
    transpose_u8_kernel(const uint8_t* __restrict__ q, int64_t rows, int64_t cols, uint8_t* __restrict__ qt) {
  __shared__ __align__(16) uint32_t tile[kT][kT / 4];
  const int64_t e = blockIdx.z, r0 = static_cast<int64_t>(blockIdx.y) * kT, c0 = static_cast<int64_t>(blockIdx.x) * kT;
  const int nr = static_cast<int>(min(static_cast<int64_t>(kT), rows - r0));
  const int nc = static_cast<int>(min(static_cast<int64_t>(kT), cols - c0));
  transpose_tile<LW, SW>(q + e * rows * cols + r0 * cols + c0, cols, nr, nc, qt + e * rows * cols + c0 * rows + r0,
                         rows, nr, tile);
}
__global__ void transpose_scales_kernel(const float* __restrict__ s, int64_t experts, int64_t rb, int64_t cb,
                                        float* __restrict__ st) {
  const int64_t n = experts * rb * cb;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t e = i / (rb * cb), r = (i / cb) % rb, c = i % cb;
    st[(e * cb + c) * rb + r] = s[i];
  }
}

// The widest access (16, 4 or 1 bytes) that rows of `len` bytes at `p` allow.
int byte_width(const void* p, int64_t len) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  if (len % 16 == 0 && a % 16 == 0) return 16;
  if (len % 4 == 0 && a % 4 == 0) return 4;
  return 1;
}

// Token blocks [T, K] -> [K, Tp]: 128-row token tile i (the group schedule's; scale row i) to
// columns [128 i, 128 i + 128), the rows past its group's end as 0 (whole 128-byte output pieces).
// One CTA per (tile, 128 columns) through transpose_tile; tiles past the real count are skipped
// (no k-block reads them).
template <int LW, int SW>
__global__ void __launch_bounds__(kThreads)
    transpose_token_blocks_kernel(const uint8_t* __restrict__ q, int64_t rows, int64_t k, GroupSchedule sched,
                                  int64_t tp, uint8_t* __restrict__ qt) {
  __shared__ __align__(16) uint32_t tile[kT][kT / 4];
  const TokenTile t = token_tile(sched, blockIdx.x, rows);
  if (t.n <= 0) return;
  const int64_t c0 = static_cast<int64_t>(blockIdx.y) * kT;
  transpose_tile<LW, SW>(q + t.row0 * k + c0, k, static_cast<int>(t.n),
                         static_cast<int>(min(static_cast<int64_t>(kT), k - c0)),
                         qt + c0 * tp + static_cast<int64_t>(blockIdx.x) * kFp8Block, tp, kFp8Block, tile);
}

}  // namespace

int64_t fp8_token_block_tiles(const GroupOffsets& g, int64_t rows) { return token_tiles(g, rows); }

void transpose_token_blocks(const Mxfp8View& v, const GroupOffsets& g, uint8_t* qt, int64_t tp, void* stream_ptr) {
  const cudaStream_t stream = as_stream(stream_ptr);
  const int64_t rows = v.data.shape[0], k = v.data.shape[1];
  if (rows == 0 || k == 0) return;
  if (tp % 16 != 0 || tp < token_tiles(g, rows) * kFp8Block)
    throw Error("tp", "internal: transposed pitch too small or unaligned");
  Workspace ws(token_schedule_bytes(g, rows), stream);
  const GroupSchedule sched = token_schedule(g, rows, ws, stream);
  if (ceil_div(k, kT) > 65535) throw Error("k", "more than 65535 128-column tiles for one transpose grid");
  const dim3 grid(static_cast<unsigned>(token_tiles(g, rows)), static_cast<unsigned>(ceil_div(k, kT)));
  const uint8_t* q = v.data.ptr<uint8_t>();
  with_width(byte_width(q, k), [&](auto LW) {
    with_width(byte_width(qt, tp), [&](auto SW) {
      transpose_token_blocks_kernel<LW(), SW()><<<grid, kThreads, 0, stream>>>(q, rows, k, sched, tp, qt);
    });
  });
  MXMOE_CUDA_CHECK_LAUNCH();
}

void transpose_fp8_block_weights(const uint8_t* q, const float* sinv, int64_t experts, int64_t rows, int64_t cols,
                                 uint8_t* qt, float* sinv_t, void* stream_ptr) {
  const cudaStream_t stream = as_stream(stream_ptr);
  if (experts == 0 || rows == 0 || cols == 0) return;
  if (experts > 65535) throw Error("experts", "more than 65535 experts for one transpose grid");
  if (ceil_div(rows, kT) > 65535) throw Error("rows", "more than 65535 128-row tiles for one transpose grid");
  if (ceil_div(cols, kT) > 0x7fffffff) throw Error("cols", "too many 128-column tiles for one transpose grid");
  const dim3 grid(static_cast<unsigned>(ceil_div(cols, kT)), static_cast<unsigned>(ceil_div(rows, kT)),
                  static_cast<unsigned>(experts));
  // Every expert's rows start at a multiple of the width too (e rows cols with cols (rows) a multiple).
  with_width(byte_width(q, cols), [&](auto LW) {
    with_width(byte_width(qt, rows),
               [&](auto SW) { transpose_u8_kernel<LW(), SW()><<<grid, kThreads, 0, stream>>>(q, rows, cols, qt); });
  });
  MXMOE_CUDA_CHECK_LAUNCH();
  const int64_t rb = ceil_div(rows, kFp8Block), cb = ceil_div(cols, kFp8Block);
  transpose_scales_kernel<<<grid_1d(experts * rb * cb), kThreads, 0, stream>>>(sinv, experts, rb, cb, sinv_t);
  MXMOE_CUDA_CHECK_LAUNCH();
}

}  // namespace mxmoe::cuda
