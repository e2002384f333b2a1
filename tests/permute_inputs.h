// Inputs of the permute-quantize tests (tests/unit/test_permute_quantize.cpp and
// tests/gpu/test_permute_quantize_gpu.cpp): x with magnitudes spread over 2^-12 .. 2^12 per token
// (so block scales differ), probabilities, and top-k ids over a random subset of the experts (the
// others get no token), a fraction of them invalid (-1, E, or 2^33 with int64 ids).
#pragma once
#include <algorithm>
#include <cmath>
#include <ostream>
#include <random>
#include <vector>

#include "mxmoe/numerics.h"
#include "tests/support.h"

namespace mxmoe::test {

struct PermuteCase {
  int64_t T, K, E, capacity, H;
  double invalid_fraction = 0;
  bool int64_ids = false;
  int active_experts = 0;  // 0: half of E
};

// gtest prints a parameterised case with it.
inline std::ostream& operator<<(std::ostream& os, const PermuteCase& c) {
  return os << "T" << c.T << "_K" << c.K << "_E" << c.E << "_C" << c.capacity << "_H" << c.H << "_bad"
            << c.invalid_fraction << (c.int64_ids ? "_i64" : "");
}

struct PermuteInputs {
  HostTensor x, ids, probs;
};

inline PermuteInputs make_permute_inputs(const PermuteCase& c, std::mt19937_64& gen) {
  PermuteInputs in{HostTensor(DType::bf16, {c.T, c.H}), HostTensor(c.int64_ids ? DType::i64 : DType::i32, {c.T, c.K}),
            HostTensor(DType::f32, {c.T, c.K})};
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::uniform_int_distribution<int> mag(-12, 12);
  for (int64_t t = 0; t < c.T; ++t) {
    const float s = std::ldexp(1.0f, mag(gen));
    for (int64_t h = 0; h < c.H; ++h) in.x.ptr<uint16_t>()[t * c.H + h] = bf16_from_f32(u(gen) * s);
  }
  for (int64_t i = 0; i < in.probs.numel(); ++i) in.probs.ptr<float>()[i] = u(gen);
  std::vector<int64_t> active(static_cast<size_t>(c.E));
  for (int64_t e = 0; e < c.E; ++e) active[e] = e;
  std::shuffle(active.begin(), active.end(), gen);
  active.resize(static_cast<size_t>(c.active_experts > 0 ? c.active_experts : std::max<int64_t>(1, c.E / 2)));
  std::bernoulli_distribution bad(c.invalid_fraction);
  const int64_t bad_ids[] = {-1, c.E, int64_t{1} << 33};
  for (int64_t i = 0; i < c.T * c.K; ++i) {
    int64_t id = active[std::uniform_int_distribution<size_t>(0, active.size() - 1)(gen)];
    if (bad(gen)) id = bad_ids[std::uniform_int_distribution<int>(c.int64_ids ? 0 : 0, c.int64_ids ? 2 : 1)(gen)];
    if (c.int64_ids)
      in.ids.ptr<int64_t>()[i] = id;
    else
      in.ids.ptr<int32_t>()[i] = static_cast<int32_t>(id);
  }
  return in;
}

}  // namespace mxmoe::test
