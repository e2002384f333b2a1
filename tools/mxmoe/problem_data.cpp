// Random layer inputs from a seed. Every element is a pure function of (seed, tensor, index), so the
// inputs are identical whatever the thread count, and generating GBs of them is parallel.
//   x, dy ~ U(-1,1) bf16; probs ~ U(0,1) f32; biases ~ U(-0.5,0.5) bf16;
//   W1 ~ U(-3/sqrt(H), 3/sqrt(H)) so that FC1's outputs have unit variance, and
//   W2 ~ U(-5/sqrt(F), 5/sqrt(F)) so that Y is O(1) (p*act has rms ~0.35 for unit-variance inputs).
// Token split: balanced (T/E each), or skewed: Dirichlet(0.5) shares from gamma draws with about
// one expert in eight forced empty.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "tools/mxmoe/cli.h"

namespace mxmoe::cli {
namespace {

enum Stream : uint64_t { kX = 1, kDy, kProbs, kW1, kB1, kW2, kB2 };

uint64_t splitmix(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

double uniform01(uint64_t seed, Stream s, uint64_t i) {
  const uint64_t h = splitmix(splitmix(seed * 0x2545f4914f6cdd1dull + s) ^ i);
  return static_cast<double>(h >> 11) * 0x1p-53;
}

std::vector<uint16_t> random_bf16(uint64_t seed, Stream s, int64_t n, double lo, double hi) {
  std::vector<uint16_t> v(static_cast<size_t>(n));
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i)
    v[i] = bf16_from_f32(static_cast<float>(lo + (hi - lo) * uniform01(seed, s, static_cast<uint64_t>(i))));
  return v;
}

}  // namespace

std::vector<int64_t> token_split(int64_t tokens, int64_t experts, bool skew, uint64_t seed) {
  std::vector<int64_t> sizes(static_cast<size_t>(experts), tokens / experts);
  if (!skew) {
    for (int64_t e = 0; e < tokens % experts; ++e) ++sizes[e];
    return sizes;
  }
  std::mt19937_64 gen(splitmix(seed ^ 0x5eedull));
  std::gamma_distribution<double> gamma(0.5, 1.0);  // normalized gammas are Dirichlet(0.5)
  std::vector<double> share(static_cast<size_t>(experts));
  for (double& w : share) w = std::max(gamma(gen), 1e-300);
  if (experts >= 2) {
    std::vector<int64_t> order(static_cast<size_t>(experts));
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), gen);
    const int64_t empty = std::max<int64_t>(1, experts / 8);
    for (int64_t i = 0; i < empty; ++i) share[order[i]] = 0.0;
  }
  const double total = std::accumulate(share.begin(), share.end(), 0.0);
  int64_t assigned = 0;
  std::vector<std::pair<double, int64_t>> remainder;
  for (int64_t e = 0; e < experts; ++e) {
    const double exact = static_cast<double>(tokens) * share[e] / total;
    sizes[e] = static_cast<int64_t>(std::floor(exact));
    assigned += sizes[e];
    if (share[e] > 0) remainder.push_back({exact - static_cast<double>(sizes[e]), e});
  }
  std::sort(remainder.begin(), remainder.end(), std::greater<>());
  for (size_t i = 0; assigned < tokens; i = (i + 1) % remainder.size(), ++assigned) ++sizes[remainder[i].second];
  return sizes;
}

LayerData make_layer_data(const RunConfig& cfg) {
  const Problem& p = cfg.problem;
  const int64_t T = cfg.tokens, H = p.hidden, F = p.ffn, E = p.experts;
  const uint64_t seed = cfg.seed;
  LayerData d;
  d.problem = p;
  d.tokens = T;
  const std::vector<int64_t> sizes = token_split(T, E, cfg.skew, seed);
  d.offsets.assign(static_cast<size_t>(E + 1), 0);
  for (int64_t e = 0; e < E; ++e) d.offsets[e + 1] = d.offsets[e] + static_cast<int32_t>(sizes[e]);

  d.x = random_bf16(seed, kX, T * H, -1, 1);
  d.dy = random_bf16(seed, kDy, T * H, -1, 1);
  d.probs.resize(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) d.probs[t] = static_cast<float>(uniform01(seed, kProbs, static_cast<uint64_t>(t)));
  const double w1_bound = 3.0 / std::sqrt(static_cast<double>(H));
  const double w2_bound = 5.0 / std::sqrt(static_cast<double>(F));
  d.w1 = std::make_shared<std::vector<uint16_t>>(random_bf16(seed, kW1, E * 2 * F * H, -w1_bound, w1_bound));
  d.w2 = std::make_shared<std::vector<uint16_t>>(random_bf16(seed, kW2, E * H * F, -w2_bound, w2_bound));
  d.b1 = std::make_shared<std::vector<uint16_t>>(p.fc1_bias ? random_bf16(seed, kB1, E * 2 * F, -0.5, 0.5)
                                                            : std::vector<uint16_t>{});
  d.b2 = std::make_shared<std::vector<uint16_t>>(p.fc2_bias ? random_bf16(seed, kB2, E * H, -0.5, 0.5)
                                                            : std::vector<uint16_t>{});
  return d;
}

LayerData select_rows(const LayerData& full, const std::vector<int64_t>& rows) {
  const int64_t H = full.problem.hidden, E = full.problem.experts;
  LayerData d;
  d.problem = full.problem;
  d.tokens = static_cast<int64_t>(rows.size());
  d.offsets.assign(static_cast<size_t>(E + 1), 0);
  for (int64_t e = 0; e < E; ++e) {
    const auto lo = std::lower_bound(rows.begin(), rows.end(), static_cast<int64_t>(full.offsets[e]));
    const auto hi = std::lower_bound(rows.begin(), rows.end(), static_cast<int64_t>(full.offsets[e + 1]));
    d.offsets[e + 1] = d.offsets[e] + static_cast<int32_t>(hi - lo);
  }
  d.x.resize(rows.size() * H);
  d.dy.resize(rows.size() * H);
  d.probs.resize(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    std::copy_n(&full.x[rows[i] * H], H, &d.x[i * H]);
    std::copy_n(&full.dy[rows[i] * H], H, &d.dy[i * H]);
    d.probs[i] = full.probs[rows[i]];
  }
  d.w1 = full.w1;
  d.b1 = full.b1;
  d.w2 = full.w2;
  d.b2 = full.b2;
  return d;
}

LayerData select_expert(const LayerData& full, int64_t expert) {
  const int64_t H = full.problem.hidden, F = full.problem.ffn;
  const int64_t lo = full.offsets[expert], m = full.expert_size(expert);
  LayerData d;
  d.problem = full.problem;
  d.problem.experts = 1;
  d.tokens = m;
  d.offsets = {0, static_cast<int32_t>(m)};
  d.x.assign(full.x.begin() + lo * H, full.x.begin() + (lo + m) * H);
  d.dy.assign(full.dy.begin() + lo * H, full.dy.begin() + (lo + m) * H);
  d.probs.assign(full.probs.begin() + lo, full.probs.begin() + lo + m);
  auto slice = [](const std::vector<uint16_t>& v, int64_t begin, int64_t count) {
    if (v.empty()) return std::make_shared<std::vector<uint16_t>>();
    return std::make_shared<std::vector<uint16_t>>(v.begin() + begin, v.begin() + begin + count);
  };
  d.w1 = slice(*full.w1, expert * 2 * F * H, 2 * F * H);
  d.w2 = slice(*full.w2, expert * H * F, H * F);
  d.b1 = slice(*full.b1, expert * 2 * F, 2 * F);
  d.b2 = slice(*full.b2, expert * H, H);
  return d;
}

}  // namespace mxmoe::cli
