// Every device backend's MXFP8 quantize / dequantize / quantize_experts steps (run once per backend,
// test names ending in /<backend>; cuda_portable's kernels are in src/cuda/quant/) against the CPU
// reference (src/cpu/quant.cpp), bit-exact: scales, data and every padding byte. Inputs are fresh
// random bf16 with NaN, Inf, all-zero blocks, subnormal-scale blocks and 448-boundary blocks; GPU
// outputs are poisoned with 0xA5 and CPU outputs with 0x5A, so an unwritten byte on either side fails.
// Group offsets live on the device; the graph test changes them between replays of one capture.
// Run: <build>/tests/mxmoe_gpu_tests --gtest_filter='*GpuQuant*'
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <initializer_list>
#include <random>
#include <string>
#include <vector>

#include "src/common/fp8_block.h"
#include "src/cpu/cpu_ops.h"
#include "tests/gpu_support.h"

#if defined(MXMOE_WITH_CUDA)
#include <cuda_runtime.h>
#endif

namespace mxmoe::test {
namespace {

#if defined(MXMOE_WITH_CUDA)

constexpr uint8_t kGpuPoison = 0xA5;
constexpr uint8_t kCpuPoison = 0x5A;
constexpr ScaleLayout kLayouts[] = {ScaleLayout::compact, ScaleLayout::swizzled};

const char* layout_name(ScaleLayout l) { return l == ScaleLayout::compact ? "compact" : "swizzled"; }

// bf16 [m, k] in U(-2, 2) with special 32x32 regions (not aligned to groups, so they hit row and
// column blocks alike) and sprinkled NaN / Inf elements.
HostTensor make_input(int64_t m, int64_t k) {
  HostTensor t = random_bf16({m, k}, -2.f, 2.f);
  auto* v = t.ptr<uint16_t>();
  std::uniform_int_distribution<int> kind(0, 19);
  std::uniform_int_distribution<int> shift(-24, 24);
  std::uniform_real_distribution<float> unit(-1.f, 1.f);
  std::uniform_real_distribution<float> near448(440.f, 456.f);
  for (int64_t r0 = 0; r0 < m; r0 += 32) {
    for (int64_t c0 = 0; c0 < k; c0 += 32) {
      const int what = kind(rng());
      const int s = shift(rng());
      for (int64_t r = r0; r < std::min(m, r0 + 32); ++r) {
        for (int64_t c = c0; c < std::min(k, c0 + 32); ++c) {
          uint16_t& x = v[r * k + c];
          const float f = f32_from_bf16(x);
          switch (what) {
            case 0: x = 0; break;                                              // all-zero block
            case 1: x = bf16_from_f32(std::ldexp(f, -130)); break;             // subnormal scale
            case 2: x = bf16_from_f32(std::ldexp(f, -140)); break;             // deep subnormal
            case 3: x = bf16_from_f32(std::ldexp(f, 100)); break;              // large scale
            case 4: x = bf16_from_f32(std::ldexp(f, 126)); break;              // near FLT_MAX
            case 5: x = bf16_from_f32(std::copysign(std::ldexp(near448(rng()), s), unit(rng()))); break;
            case 6: x = bf16_from_f32(std::ldexp(f, s)); break;
            default: break;
          }
        }
      }
    }
  }
  std::uniform_int_distribution<int64_t> pos(0, std::max<int64_t>(m * k - 1, 0));
  const uint16_t specials[] = {0x7fc0, 0xffc0, 0x7f81, 0x7f80, 0xff80, 0x7f7f, 0xff7f, 0x0001, 0x8000};
  const int64_t n_special = m * k / 2000 + (m * k > 0 ? 4 : 0);
  for (int64_t i = 0; i < n_special; ++i) v[pos(rng())] = specials[i % std::size(specials)];
  return t;
}

std::vector<int> shuffled(std::vector<int> v) {
  std::shuffle(v.begin(), v.end(), rng());
  return v;
}

// E sizes summing to about `total`, heavily skewed, about a quarter of them empty.
std::vector<int> skewed_sizes(int experts, int total) {
  std::exponential_distribution<double> w(1.0);
  std::bernoulli_distribution empty(0.25);
  std::vector<double> weights(experts);
  double sum = 0;
  for (double& x : weights) sum += (x = empty(rng()) ? 0.0 : std::pow(w(rng()), 3.0));
  std::vector<int> sizes(experts, 0);
  if (sum == 0) return sizes;
  for (int e = 0; e < experts; ++e) sizes[e] = static_cast<int>(weights[e] / sum * total);
  return sizes;
}

void expect_same_bytes(const HostTensor& gpu, const HostTensor& cpu, const std::string& what) {
  ASSERT_EQ(gpu.bytes.size(), cpu.bytes.size()) << what;
  int64_t bad = 0;
  for (size_t i = 0; i < gpu.bytes.size(); ++i) {
    if (gpu.bytes[i] == cpu.bytes[i]) continue;
    if (bad < 5) {
      ADD_FAILURE() << what << ": byte " << i << " gpu=0x" << std::hex << int{gpu.bytes[i]} << " cpu=0x"
                    << int{cpu.bytes[i]} << std::dec;
    }
    ++bad;
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << gpu.bytes.size() << " bytes differ";
}

bool any_nonzero(const HostTensor& t) {
  return std::any_of(t.bytes.begin(), t.bytes.end(), [](uint8_t b) { return b != 0; });
}

// One MXFP8 output: host and device buffers of the same shape.
struct MxOut {
  HostTensor data, scales;
  DeviceTensor d_data, d_scales;
  MxOut(int64_t m, int64_t k, int64_t scale_bytes)
      : data(DType::e4m3, {m, k}), scales(DType::e8m0, {scale_bytes}), d_data(data.view), d_scales(scales.view) {}
  Mxfp8View host(BlockAxis axis, ScaleLayout layout) {
    data.poison(kCpuPoison);
    scales.poison(kCpuPoison);
    Mxfp8View v{data.view, scales.view, axis, layout};
    static uint8_t empty_marker;  // an M = 0 output is still requested (its scales are still zeroed)
    if (v.data.data == nullptr) v.data.data = &empty_marker;
    return v;
  }
  Mxfp8View device(BlockAxis axis, ScaleLayout layout) {
    d_data.poison(kGpuPoison);
    d_scales.poison(kGpuPoison);
    return {d_data.view, d_scales.view, axis, layout};
  }
};

struct QuantCase {
  std::vector<int> sizes;  // empty with grouped = false: one ungrouped tensor of `rows` rows
  bool grouped = true;
  int64_t rows = 0;
  int64_t k = 0;
  bool row = true, col = true;
  ScaleLayout layout = ScaleLayout::compact;
};

std::string describe(const QuantCase& c) {
  std::string s = "K=" + std::to_string(c.k) + " layout=" + layout_name(c.layout) + (c.row ? " row" : "") +
                  (c.col ? " col" : "") + " sizes={";
  for (size_t i = 0; i < c.sizes.size() && i < 40; ++i) s += std::to_string(c.sizes[i]) + ",";
  return s + "}";
}

// Quantizes fresh input on both backends; `offsets_override` (host i32 [E+1]) replaces the offsets
// derived from the sizes (used for invalid device offsets).
void check_quantize(detail::Backend& backend, const QuantCase& c, const HostTensor* offsets_override = nullptr) {
  SCOPED_TRACE(describe(c));
  const detail::StepQuery q{detail::Step::quantize, kGpu0, Recipe::mxfp8, 0, c.k};
  MXMOE_SKIP_UNLESS_SERVED(backend, backend.probe(q));
  HostTensor offsets = offsets_override ? *offsets_override : offsets_from_sizes(c.sizes);
  const int64_t experts = c.grouped ? offsets.numel() - 1 : 1;
  int64_t m = c.rows;
  if (c.grouped && !offsets_override) m = offsets.ptr<int32_t>()[experts];
  const int64_t k = c.k;
  HostTensor src = make_input(m, k);
  DeviceTensor d_src(src), d_offsets(offsets);

  MxOut row(m, k, rowwise_scale_bytes(m, k)), col(m, k, colwise_scale_bytes(m, k, experts));
  QuantizeArgs host, dev;
  host.src = src.view;
  dev.src = d_src.view;
  if (c.grouped) {
    host.groups.offsets = offsets.view;
    dev.groups.offsets = d_offsets.view;
  }
  if (c.row) {
    host.rowwise = row.host(BlockAxis::row, c.layout);
    dev.rowwise = row.device(BlockAxis::row, c.layout);
  }
  if (c.col) {
    host.colwise = col.host(BlockAxis::col, c.layout);
    dev.colwise = col.device(BlockAxis::col, c.layout);
  }
  cpu::quantize(host);
  Context ctx;
  backend.quantize(ctx, dev);
  cuda_ok(cudaDeviceSynchronize());
  if (c.row) {
    expect_same_bytes(row.d_data.download(), row.data, "rowwise data");
    expect_same_bytes(row.d_scales.download(), row.scales, "rowwise scales");
    if (m > 0) {
      EXPECT_TRUE(any_nonzero(row.data));
    }
  }
  if (c.col) {
    expect_same_bytes(col.d_data.download(), col.data, "colwise data");
    expect_same_bytes(col.d_scales.download(), col.scales, "colwise scales");
    if (m > 0) {
      EXPECT_TRUE(any_nonzero(col.data));
    }
  }
}

const std::vector<int> kEdgeSizes = {0, 1, 31, 32, 33, 127, 128, 129};

#endif  // MXMOE_WITH_CUDA

class GpuQuant : public GpuBackendTest {};
MXMOE_GPU_BACKEND_SUITE(GpuQuant);

TEST_P(GpuQuant, QuantizeMatchesCpuForEdgeGroupSizesAllModes) {
#if defined(MXMOE_WITH_CUDA)
  for (int64_t k : {1408, 2880}) {
    for (ScaleLayout layout : kLayouts) {
      for (auto [row, col] : {std::pair{true, true}, std::pair{true, false}, std::pair{false, true}}) {
        QuantCase c{shuffled(kEdgeSizes), true, 0, k, row, col, layout};
        check_quantize(backend(), c);
      }
    }
  }
#endif
}

TEST_P(GpuQuant, QuantizeMatchesCpuForSkewedSplitsOfManyTokens) {
#if defined(MXMOE_WITH_CUDA)
  for (ScaleLayout layout : kLayouts) {
    check_quantize(backend(), {skewed_sizes(32, 20000), true, 0, 2880, true, true, layout});
    check_quantize(backend(), {skewed_sizes(128, 9000), true, 0, 1408, true, true, layout});
  }
#endif
}

TEST_P(GpuQuant, QuantizeMatchesCpuForSingleGroupAndUngroupedTensors) {
#if defined(MXMOE_WITH_CUDA)
  for (ScaleLayout layout : kLayouts) {
    check_quantize(backend(), {{19999}, true, 0, 1408, true, true, layout});
    check_quantize(backend(), {{}, false, 4000 + 17, 2880, true, true, layout});
    check_quantize(backend(), {{}, false, 4000 + 17, 2880, false, true, layout});
  }
#endif
}

TEST_P(GpuQuant, QuantizeWritesZeroScalesForAllEmptyGroups) {
#if defined(MXMOE_WITH_CUDA)
  for (ScaleLayout layout : kLayouts) {
    check_quantize(backend(), {{0, 0, 0, 0}, true, 0, 1408, true, true, layout});
    check_quantize(backend(), {{0, 0, 0, 0}, true, 0, 2880, false, true, layout});
    check_quantize(backend(), {{}, false, 0, 1408, true, true, layout});
  }
#endif
}

TEST_P(GpuQuant, ColumnWiseQuantizeHandlesWidthsThatAreNotMultiplesOf128) {
#if defined(MXMOE_WITH_CUDA)
  for (ScaleLayout layout : kLayouts) {
    check_quantize(backend(), {shuffled(kEdgeSizes), true, 0, 96, true, true, layout});   // < one tile wide
    check_quantize(backend(), {shuffled(kEdgeSizes), true, 0, 72, false, true, layout});  // K % 32 != 0
    check_quantize(backend(), {shuffled(kEdgeSizes), true, 0, 100, false, true, layout}); // K % 8 != 0: scalar path
  }
#endif
}

TEST_P(GpuQuant, InvalidDeviceOffsetsAreClampedLikeTheCpuReference) {
#if defined(MXMOE_WITH_CUDA)
  // Non-monotone and out-of-range middle offsets; first 0 and last M so every row has a group.
  const int m = 700;
  HostTensor offsets(DType::i32, {7});
  const int32_t raw[] = {0, 50, 20, 5000, -1, 333, m};
  std::copy(std::begin(raw), std::end(raw), offsets.ptr<int32_t>());
  for (ScaleLayout layout : kLayouts) check_quantize(backend(), {{}, true, m, 1408, true, true, layout}, &offsets);
#endif
}

#if defined(MXMOE_WITH_CUDA)
// Random E4M3 codes (NaN included) and random scales (0, 254 and 255 included).
HostTensor random_bytes(std::initializer_list<int64_t> shape, DType t, int lo, int hi) {
  HostTensor h(t, shape);
  std::uniform_int_distribution<int> d(lo, hi);
  for (auto& b : h.bytes) b = static_cast<uint8_t>(d(rng()));
  return h;
}

// Dequantized values: identical bits, or NaN on both sides (the bits of a NaN product depend on the
// host CPU's NaN propagation).
void expect_same_values(const HostTensor& gpu, const HostTensor& cpu, const std::string& what) {
  ASSERT_EQ(gpu.numel(), cpu.numel());
  const bool f32 = gpu.view.dtype == DType::f32;
  int64_t bad = 0;
  for (int64_t i = 0; i < gpu.numel(); ++i) {
    uint32_t a, b;
    float fa, fb;
    if (f32) {
      a = f32_bits(gpu.ptr<float>()[i]), b = f32_bits(cpu.ptr<float>()[i]);
      fa = gpu.ptr<float>()[i], fb = cpu.ptr<float>()[i];
    } else {
      a = gpu.ptr<uint16_t>()[i], b = cpu.ptr<uint16_t>()[i];
      fa = f32_from_bf16(static_cast<uint16_t>(a)), fb = f32_from_bf16(static_cast<uint16_t>(b));
    }
    if (a == b || (std::isnan(fa) && std::isnan(fb))) continue;
    if (bad < 5) ADD_FAILURE() << what << ": element " << i << " gpu=" << fa << " cpu=" << fb;
    ++bad;
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << gpu.numel() << " values differ";
}

void check_dequantize(detail::Backend& backend, BlockAxis axis, ScaleLayout layout, DType out,
                      const std::vector<int>& sizes, int64_t k) {
  SCOPED_TRACE(std::string(axis == BlockAxis::row ? "row" : "col") + " " + layout_name(layout) +
               (out == DType::f32 ? " f32" : " bf16") + " K=" + std::to_string(k));
  const detail::StepQuery q{detail::Step::dequantize, kGpu0, Recipe::mxfp8, 0, k};
  MXMOE_SKIP_UNLESS_SERVED(backend, backend.probe(q));
  HostTensor offsets = offsets_from_sizes(sizes);
  const int64_t experts = static_cast<int64_t>(sizes.size());
  const int64_t m = offsets.ptr<int32_t>()[experts];
  const int64_t scale_bytes = axis == BlockAxis::row ? rowwise_scale_bytes(m, k) : colwise_scale_bytes(m, k, experts);
  HostTensor data = random_bytes({m, k}, DType::e4m3, 0, 255);
  HostTensor scales = random_bytes({scale_bytes}, DType::e8m0, 100, 150);
  for (int64_t i = 0; i < scale_bytes; i += 97) scales.bytes[i] = static_cast<uint8_t>(i % 4 == 0 ? 0 : 250 + i % 6);
  DeviceTensor d_data(data), d_scales(scales), d_offsets(offsets);
  HostTensor dst(out, {m, k});
  DeviceTensor d_dst(dst.view);
  dst.poison(kCpuPoison);
  d_dst.poison(kGpuPoison);

  DequantizeArgs host{{data.view, scales.view, axis, layout}, {}, dst.view};
  DequantizeArgs dev{{d_data.view, d_scales.view, axis, layout}, {}, d_dst.view};
  if (axis == BlockAxis::col) {
    host.groups.offsets = offsets.view;
    dev.groups.offsets = d_offsets.view;
  }
  cpu::dequantize(host);
  Context ctx;
  backend.dequantize(ctx, dev);
  cuda_ok(cudaDeviceSynchronize());
  expect_same_values(d_dst.download(), dst, "dequantized");
}
#endif

TEST_P(GpuQuant, DequantizeMatchesCpuBothAxesLayoutsAndOutputTypes) {
#if defined(MXMOE_WITH_CUDA)
  for (ScaleLayout layout : kLayouts) {
    for (DType out : {DType::f32, DType::bf16}) {
      check_dequantize(backend(), BlockAxis::row, layout, out, {3000}, 2880);
      check_dequantize(backend(), BlockAxis::row, layout, out, shuffled(kEdgeSizes), 1408);
      check_dequantize(backend(), BlockAxis::col, layout, out, shuffled(kEdgeSizes), 1408);
      check_dequantize(backend(), BlockAxis::col, layout, out, skewed_sizes(32, 12000), 2880);
      check_dequantize(backend(), BlockAxis::col, layout, out, shuffled(kEdgeSizes), 100);
      check_dequantize(backend(), BlockAxis::col, layout, out, {0, 0, 0}, 1408);
      // K below one 128-column tile, both axes.
      check_dequantize(backend(), BlockAxis::col, layout, out, shuffled(kEdgeSizes), 48);
      check_dequantize(backend(), BlockAxis::row, layout, out, {77, 0, 300}, 96);
    }
  }
#endif
}

TEST_P(GpuQuant, DequantizeOfQuantizeRoundTripsThroughBothBackends) {
#if defined(MXMOE_WITH_CUDA)
  // Quantize on the GPU, dequantize on the GPU, compare with the CPU doing both.
  const std::vector<int> sizes = shuffled({0, 1, 31, 32, 33, 127, 128, 129, 1000, 0, 257});
  HostTensor offsets = offsets_from_sizes(sizes);
  const int64_t m = offsets.ptr<int32_t>()[sizes.size()], k = 1408, experts = static_cast<int64_t>(sizes.size());
  MXMOE_SKIP_UNLESS_SERVED(backend(), backend().probe({detail::Step::quantize, kGpu0, Recipe::mxfp8, 0, k}));
  MXMOE_SKIP_UNLESS_SERVED(backend(), backend().probe({detail::Step::dequantize, kGpu0, Recipe::mxfp8, 0, k}));
  HostTensor src = make_input(m, k);
  DeviceTensor d_src(src), d_offsets(offsets);
  MxOut col(m, k, colwise_scale_bytes(m, k, experts));
  QuantizeArgs host{src.view, {offsets.view}, {}, col.host(BlockAxis::col, ScaleLayout::swizzled)};
  QuantizeArgs dev{d_src.view, {d_offsets.view}, {}, col.device(BlockAxis::col, ScaleLayout::swizzled)};
  cpu::quantize(host);
  Context ctx;
  backend().quantize(ctx, dev);
  HostTensor dst(DType::f32, {m, k});
  DeviceTensor d_dst(dst.view);
  dst.poison(kCpuPoison);
  d_dst.poison(kGpuPoison);
  cpu::dequantize({host.colwise, {offsets.view}, dst.view});
  backend().dequantize(ctx, {dev.colwise, {d_offsets.view}, d_dst.view});
  cuda_ok(cudaDeviceSynchronize());
  expect_same_values(d_dst.download(), dst, "round trip");
#endif
}

#if defined(MXMOE_WITH_CUDA)
void check_quantize_experts(detail::Backend& backend, int64_t experts, int64_t rows, int64_t cols, BlockAxis axis,
                            ScaleLayout layout) {
  SCOPED_TRACE(std::string(axis == BlockAxis::row ? "row" : "col") + " " + layout_name(layout) +
               " E=" + std::to_string(experts) + " rows=" + std::to_string(rows) + " cols=" + std::to_string(cols));
  const detail::StepQuery q{detail::Step::quantize_experts, kGpu0, Recipe::mxfp8, rows, cols};
  MXMOE_SKIP_UNLESS_SERVED(backend, backend.probe(q));
  const int64_t per = axis == BlockAxis::row ? rowwise_scale_bytes(rows, cols) : colwise_matrix_scale_bytes(rows, cols);
  HostTensor dense = make_input(experts * rows, cols);
  dense.view = TensorView::of(dense.bytes.data(), DType::bf16, {experts, rows, cols});
  DeviceTensor d_dense(dense);

  // Per-expert layout: one device allocation per expert, same contents as the dense slices.
  std::vector<DeviceTensor> d_mats;
  HostTensor table(DType::i64, {experts});
  for (int64_t e = 0; e < experts; ++e) {
    HostTensor one(DType::bf16, {rows, cols});
    std::copy_n(dense.bytes.begin() + e * rows * cols * 2, rows * cols * 2, one.bytes.begin());
    d_mats.emplace_back(one);
    table.ptr<int64_t>()[e] = reinterpret_cast<int64_t>(d_mats.back().ptr);
  }
  DeviceTensor d_table(table);

  HostTensor data(DType::e4m3, {experts, rows, cols}), scales(DType::e8m0, {experts, per});
  data.poison(kCpuPoison);
  scales.poison(kCpuPoison);
  HostTensor deq(DType::bf16, {experts, rows, cols});
  deq.poison(kCpuPoison);
  detail::QuantizeExpertsStep host{{dense.view, {}, DType::bf16}, experts, rows, cols, data.view, scales.view, axis, layout,
                                   deq.view};
  cpu::quantize_experts(host);
  EXPECT_TRUE(any_nonzero(data));
  // The bf16 copy (prepare_weights' copies for cuda_sm90) is each value's dequantization, written
  // out here from the scale-index definitions.
  int64_t wrong = 0;
  for (int64_t e = 0; e < experts; ++e)
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) {
        const int64_t i = (e * rows + r) * cols + c;
        const int64_t s = e * per + (axis == BlockAxis::row ? rowwise_scale_index(r, c / 32, cols, layout)
                                                            : colwise_scale_index(0, rows, r / 32, c, cols, layout));
        const float v = e4m3_to_f32(data.ptr<uint8_t>()[i]) * e8m0_to_f32(scales.ptr<uint8_t>()[s]);
        wrong += deq.ptr<uint16_t>()[i] != bf16_from_f32(v);
      }
  EXPECT_EQ(wrong, 0) << "cpu dequantized copy";

  for (bool per_expert : {false, true}) {
    SCOPED_TRACE(per_expert ? "pointer table" : "dense");
    DeviceTensor d_data(data.view), d_scales(scales.view), d_deq(deq.view);
    d_data.poison(kGpuPoison);
    d_scales.poison(kGpuPoison);
    d_deq.poison(kGpuPoison);
    ExpertMatrices src;
    if (per_expert) {
      src.pointers = d_table.view;
    } else {
      src.dense = d_dense.view;
    }
    detail::QuantizeExpertsStep dev{src, experts, rows, cols, d_data.view, d_scales.view, axis, layout, d_deq.view};
    Context ctx;
    backend.quantize_experts(ctx, dev);
    cuda_ok(cudaDeviceSynchronize());
    expect_same_bytes(d_data.download(), data, "expert data");
    expect_same_bytes(d_scales.download(), scales, "expert scales");
    expect_same_bytes(d_deq.download(), deq, "expert bf16 copy");
    // Only the bf16 copy (the layer's per-call weights for cuda_sm90): the same bytes, no FP8 output.
    DeviceTensor d_only(deq.view);
    d_only.poison(kGpuPoison);
    detail::QuantizeExpertsStep only = dev;
    only.data = TensorView::of(nullptr, DType::e4m3, {experts, rows, cols}, d_only.view.device);
    only.scales = TensorView{};
    only.dequantized = d_only.view;
    backend.quantize_experts(ctx, only);
    cuda_ok(cudaDeviceSynchronize());
    expect_same_bytes(d_only.download(), deq, "expert bf16 copy alone");
  }
}

// check_quantize_experts over both scale layouts and both axes, for each {experts, rows, cols}.
void check_quantize_experts_everywhere(detail::Backend& backend, std::initializer_list<std::array<int64_t, 3>> shapes) {
  for (ScaleLayout layout : kLayouts)
    for (BlockAxis axis : {BlockAxis::row, BlockAxis::col})
      for (const auto& [experts, rows, cols] : shapes)
        check_quantize_experts(backend, experts, rows, cols, axis, layout);
}
#endif

TEST_P(GpuQuant, QuantizeExpertsDenseAndPointerTableMatchCpu) {
#if defined(MXMOE_WITH_CUDA)
  check_quantize_experts_everywhere(backend(), {{5, 200, 352}, {3, 2880, 1408}, {2, 1408, 2880}});
#endif
}

TEST_P(GpuQuant, GraphReplayWithNewDeviceOffsetsGivesNewResult) {
#if defined(MXMOE_WITH_CUDA)
  // One capture; the offsets' contents change between replays. A host read of the offsets at
  // capture time would freeze the first split into the graph.
  const int64_t k = 1408;
  MXMOE_SKIP_UNLESS_SERVED(backend(), backend().probe({detail::Step::quantize, kGpu0, Recipe::mxfp8, 0, k}));
  const std::vector<int> first = shuffled({0, 1, 31, 32, 33, 127, 128, 129, 500, 0});
  int total = 0;
  for (int s : first) total += s;
  std::vector<int> second(first.size(), 0);
  second[3] = total - 40;
  second[7] = 40;
  const int64_t m = total, experts = static_cast<int64_t>(first.size());

  HostTensor src = make_input(m, k);
  HostTensor offsets = offsets_from_sizes(first);
  DeviceTensor d_src(src), d_offsets(offsets);
  MxOut row(m, k, rowwise_scale_bytes(m, k)), col(m, k, colwise_scale_bytes(m, k, experts));
  QuantizeArgs dev{d_src.view, {d_offsets.view}, row.device(BlockAxis::row, ScaleLayout::swizzled),
                   col.device(BlockAxis::col, ScaleLayout::swizzled)};

  cudaStream_t stream;
  cuda_ok(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  Context ctx(Options{.stream = stream});
  cudaGraph_t graph;
  cuda_ok(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  backend().quantize(ctx, dev);
  cuda_ok(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec;
  cuda_ok(cudaGraphInstantiate(&exec, graph, 0));

  for (const std::vector<int>* sizes : {&first, static_cast<const std::vector<int>*>(&second), &first}) {
    offsets = offsets_from_sizes(*sizes);
    d_offsets.upload(offsets);
    row.device(BlockAxis::row, ScaleLayout::swizzled);
    col.device(BlockAxis::col, ScaleLayout::swizzled);
    cuda_ok(cudaGraphLaunch(exec, stream));
    cuda_ok(cudaStreamSynchronize(stream));
    QuantizeArgs host{src.view, {offsets.view}, row.host(BlockAxis::row, ScaleLayout::swizzled),
                      col.host(BlockAxis::col, ScaleLayout::swizzled)};
    cpu::quantize(host);
    expect_same_bytes(row.d_data.download(), row.data, "replay rowwise data");
    expect_same_bytes(row.d_scales.download(), row.scales, "replay rowwise scales");
    expect_same_bytes(col.d_data.download(), col.data, "replay colwise data");
    expect_same_bytes(col.d_scales.download(), col.scales, "replay colwise scales");
  }
  cuda_ok(cudaGraphExecDestroy(exec));
  cuda_ok(cudaGraphDestroy(graph));
  cuda_ok(cudaStreamDestroy(stream));
#endif
}

TEST_P(GpuQuant, QuantizeBandwidthOnALargeInput) {
#if defined(MXMOE_WITH_CUDA)
  // Reported, not asserted: effective bandwidth = (2 B read + 2 x 1 B written) per element.
  const int64_t m = 32768, k = 7168, experts = 32;
  MXMOE_SKIP_UNLESS_SERVED(backend(), backend().probe({detail::Step::quantize, kGpu0, Recipe::mxfp8, 0, k}));
  std::vector<int> sizes(experts, static_cast<int>(m / experts));
  HostTensor offsets = offsets_from_sizes(sizes);
  HostTensor src = random_bf16({m, k});
  DeviceTensor d_src(src), d_offsets(offsets);
  HostTensor row_data(DType::e4m3, {m, k}), row_scales(DType::e8m0, {rowwise_scale_bytes(m, k)});
  HostTensor col_data(DType::e4m3, {m, k}), col_scales(DType::e8m0, {colwise_scale_bytes(m, k, experts)});
  DeviceTensor a(row_data.view), b(row_scales.view), c(col_data.view), d(col_scales.view);
  QuantizeArgs dev{d_src.view, {d_offsets.view}, {a.view, b.view, BlockAxis::row, ScaleLayout::swizzled},
                   {c.view, d.view, BlockAxis::col, ScaleLayout::swizzled}};
  Context ctx;
  backend().quantize(ctx, dev);
  cudaEvent_t t0, t1;
  cuda_ok(cudaEventCreate(&t0));
  cuda_ok(cudaEventCreate(&t1));
  constexpr int kIters = 20;
  cuda_ok(cudaEventRecord(t0));
  for (int i = 0; i < kIters; ++i) backend().quantize(ctx, dev);
  cuda_ok(cudaEventRecord(t1));
  cuda_ok(cudaEventSynchronize(t1));
  float ms = 0;
  cuda_ok(cudaEventElapsedTime(&ms, t0, t1));
  const double sec = ms / 1e3 / kIters;
  const double bytes = static_cast<double>(m * k) * 4.0;
  std::printf("[ quant bw ] quantize row+col %lldx%lld E=%lld: %.1f us, %.2f TB/s effective\n",
              static_cast<long long>(m), static_cast<long long>(k), static_cast<long long>(experts), sec * 1e6,
              bytes / sec / 1e12);
  cuda_ok(cudaEventDestroy(t0));
  cuda_ok(cudaEventDestroy(t1));
  EXPECT_GT(sec, 0.0);
#endif
}

// ---- FP8 blockwise (recipe fp8_blockwise; src/cuda/quant/fp8_block_quantize.cu vs src/cpu/fp8_block.cpp) ----

#if defined(MXMOE_WITH_CUDA)
// Rows (1x128) and token blocks (128 rows per group) of fresh input, both scale options, bit-exact
// with the CPU reference: data, f32 scales and every padding float (outputs poisoned both sides).
void check_fp8_block_quantize(detail::Backend& backend, const std::vector<int>& sizes, int64_t k, bool pow2) {
  SCOPED_TRACE("fp8_block K=" + std::to_string(k) + (pow2 ? " pow2" : "") + " groups=" + std::to_string(sizes.size()));
  detail::StepQuery q{detail::Step::quantize, kGpu0, Recipe::fp8_blockwise, 0, k};
  MXMOE_SKIP_UNLESS_SERVED(backend, backend.probe(q));
  const HostTensor offsets = offsets_from_sizes(sizes);
  const int64_t E = offsets.numel() - 1, m = offsets.ptr<int32_t>()[E];
  HostTensor src = make_input(m, k);
  DeviceTensor d_src(src), d_offsets(offsets);
  const int64_t row_count = fp8_rowwise_scale_count(m, k), col_count = fp8_token_block_rows_capacity(m, E) * k;
  HostTensor rd(DType::e4m3, {m, k}), rs(DType::f32, {row_count}), cd(DType::e4m3, {m, k}), cs(DType::f32, {col_count});
  DeviceTensor d_rd(rd.view), d_rs(rs.view), d_cd(cd.view), d_cs(cs.view);
  for (HostTensor* t : {&rd, &rs, &cd, &cs}) t->poison(kCpuPoison);
  for (DeviceTensor* t : {&d_rd, &d_rs, &d_cd, &d_cs}) t->poison(kGpuPoison);
  auto view = [](const TensorView& d, const TensorView& sc, BlockAxis axis) {
    Mxfp8View v{d, sc, axis, ScaleLayout::compact, QuantFormat::fp8_block};
    static uint8_t marker;  // an M = 0 output is still requested
    if (v.data.data == nullptr) v.data.data = &marker;
    return v;
  };
  QuantizeArgs host{src.view, {offsets.view}, view(rd.view, rs.view, BlockAxis::row), view(cd.view, cs.view, BlockAxis::col), pow2};
  QuantizeArgs dev{d_src.view, {d_offsets.view}, view(d_rd.view, d_rs.view, BlockAxis::row),
                   view(d_cd.view, d_cs.view, BlockAxis::col), pow2};
  cpu::quantize(host);
  Context ctx;
  backend.quantize(ctx, dev);
  cuda_ok(cudaDeviceSynchronize());
  expect_same_bytes(d_rd.download(), rd, "rows data");
  expect_same_bytes(d_rs.download(), rs, "rows scales");
  expect_same_bytes(d_cd.download(), cd, "token-block data");
  expect_same_bytes(d_cs.download(), cs, "token-block scales");
  if (m > 0) {
    EXPECT_TRUE(any_nonzero(rd) && any_nonzero(cs));
  }
}
#endif

TEST_P(GpuQuant, Fp8BlockQuantizeMatchesCpuForEdgeAndSkewedGroups) {
#if defined(MXMOE_WITH_CUDA)
  for (bool pow2 : {false, true}) {
    for (int64_t k : {16, 200, 1408}) check_fp8_block_quantize(backend(), shuffled({0, 1, 127, 128, 129, 255, 300}), k, pow2);
    check_fp8_block_quantize(backend(), skewed_sizes(32, 9000), 2880, pow2);
    check_fp8_block_quantize(backend(), {0, 0, 0}, 256, pow2);
  }
#endif
}

TEST_P(GpuQuant, Fp8BlockWeightsDenseAndPointerTableMatchCpu) {
#if defined(MXMOE_WITH_CUDA)
  detail::StepQuery q{detail::Step::quantize_experts, kGpu0, Recipe::fp8_blockwise, 200, 144};
  MXMOE_SKIP_UNLESS_SERVED(backend(), backend().probe(q));
  for (bool pow2 : {false, true})
    for (bool per_expert : {false, true}) {
      const int64_t E = 3, rows = 200, cols = 144, per = fp8_weight_scale_count(rows, cols);
      HostTensor w = make_input(E * rows, cols);
      w.view = TensorView::of(w.view.data, DType::bf16, {E, rows, cols});
      DeviceTensor d_w(w);
      HostTensor table(DType::i64, {E});
      for (int64_t e = 0; e < E; ++e)
        table.ptr<int64_t>()[e] = reinterpret_cast<int64_t>(static_cast<char*>(d_w.ptr) + e * rows * cols * 2);
      DeviceTensor d_table(table);
      HostTensor qd(DType::e4m3, {E, rows, cols}), qs(DType::f32, {E * per});
      DeviceTensor d_qd(qd.view), d_qs(qs.view);
      qd.poison(kCpuPoison);
      qs.poison(kCpuPoison);
      d_qd.poison(kGpuPoison);
      d_qs.poison(kGpuPoison);
      detail::QuantizeExpertsStep host{{w.view, {}, DType::bf16}, E, rows, cols, qd.view, qs.view};
      host.format = QuantFormat::fp8_block;
      host.pow2_scales = pow2;
      detail::QuantizeExpertsStep dev = host;
      dev.src = per_expert ? ExpertMatrices{{}, d_table.view, DType::bf16} : ExpertMatrices{d_w.view, {}, DType::bf16};
      dev.data = d_qd.view;
      dev.scales = d_qs.view;
      cpu::quantize_experts(host);
      Context ctx;
      backend().quantize_experts(ctx, dev);
      cuda_ok(cudaDeviceSynchronize());
      expect_same_bytes(d_qd.download(), qd, per_expert ? "per-expert data" : "dense data");
      expect_same_bytes(d_qs.download(), qs, per_expert ? "per-expert scales" : "dense scales");
    }
#endif
}

}  // namespace
}  // namespace mxmoe::test
