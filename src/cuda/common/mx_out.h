// Where a fused quantizing epilogue writes its MXFP8 output (plain data: host and device code).
#pragma once
#include <cstdint>

#include "mxmoe/mxfp8_layout.h"

namespace mxmoe::cuda {

// Row-wise and/or column-wise (either may be absent); layouts as mxmoe/mxfp8_layout.h.
struct MxOut {
  uint8_t* row_data = nullptr;
  uint8_t* row_scales = nullptr;
  uint8_t* col_data = nullptr;
  uint8_t* col_scales = nullptr;
  ScaleLayout row_layout = ScaleLayout::compact;
  ScaleLayout col_layout = ScaleLayout::compact;
  MXMOE_HD bool any() const { return row_data != nullptr || col_data != nullptr; }
};

}  // namespace mxmoe::cuda
