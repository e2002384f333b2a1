// Group schedule of the portable grouped GEMMs, built on the device from the device-resident
// offsets by one small kernel (no host sync): per expert its clamped row range, its column-wise
// scale chunk row s_e, and its first linear m-tile; per linear m-tile the expert and first row.
// The GEMM grids are sized from the upper bound ceil(T / block_m) + E of the m-tile count; tiles
// past the real count carry expert = -1 and their CTAs exit at once.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace mxmoe::cuda::portable {

struct GroupInfo {
  int32_t begin;       // first row (offsets clamped to [0, T] and made monotone)
  int32_t end;         // one past the last row
  int32_t col_chunk;   // s_e = sum_{h<e} colwise_group_scale_rows(m_h)
  int32_t tile_start;  // first linear m-tile of this expert
};

struct TileInfo {
  int32_t expert;  // -1: beyond the real tile count
  int32_t row0;    // global first row of the tile
};

struct Schedule {
  const GroupInfo* groups = nullptr;  // [E]
  const TileInfo* tiles = nullptr;    // [tiles_bound]
  int32_t tiles_bound = 0;
};

inline int32_t m_tiles_bound(int64_t rows, int64_t experts, int block_m) {
  return static_cast<int32_t>((rows + block_m - 1) / block_m + experts);
}

// Fills groups[E] and, when tiles != nullptr, tiles[tiles_bound] with block_m-row tiles.
void launch_build_schedule(const int32_t* offsets, int64_t experts, int64_t rows, int block_m,
                           GroupInfo* groups, TileInfo* tiles, int32_t tiles_bound, cudaStream_t stream);

// Stream-ordered scratch memory (cudaMallocAsync / cudaFreeAsync, legal inside graph capture).
class Workspace {
 public:
  Workspace(int64_t bytes, cudaStream_t stream);
  ~Workspace();
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;
  // Carves `bytes` (256-byte aligned) off the buffer.
  template <class T>
  T* take(int64_t count) {
    char* p = base_ + used_;
    used_ += (count * static_cast<int64_t>(sizeof(T)) + 255) / 256 * 256;
    return reinterpret_cast<T*>(p);
  }
  static int64_t aligned(int64_t bytes) { return (bytes + 255) / 256 * 256; }

 private:
  char* base_ = nullptr;
  int64_t used_ = 0;
  cudaStream_t stream_;
};

}  // namespace mxmoe::cuda::portable
