// An independent, unquantized fp64 reference of the whole grouped-MLP layer, forward and backward
// (docs/numerics.md "Tolerances": the sanity reference that catches systematic errors).
// It shares nothing with the step code except the GLU column mapping: no quantization, no bf16
// rounding, every intermediate in double. Plain loops, OpenMP over rows and experts.
//
//   C = X W1_e^T + b1_e        A = p * act(a(C), b(C))        Y = A W2_e^T + (scale ? p b2_e : b2_e)
//
// Layouts (row-major): x, dy, y, dx [T, H]; probs, dprobs [T]; c [T, 2F]; w1, dw1 [E, 2F, H];
// w2, dw2 [E, H, F]; b1, db1 [E, 2F]; b2, db2 [E, H]. Expert e owns rows offsets[e] .. offsets[e+1]-1.
#pragma once
#include <cstdint>
#include <vector>

#include "mxmoe/problem.h"

namespace mxmoe::cpu {

struct RefLayerInputs {
  Problem problem;               // hidden, ffn, experts, activation, clamp, glu_layout, biases
  int64_t tokens = 0;            // T
  std::vector<int32_t> offsets;  // [E+1]
  std::vector<double> x;         // [T, H]
  std::vector<double> probs;     // [T]
  std::vector<double> w1;        // [E, 2F, H]
  std::vector<double> b1;        // [E, 2F] when problem.fc1_bias, else empty
  std::vector<double> w2;        // [E, H, F]
  std::vector<double> b2;        // [E, H] when problem.fc2_bias, else empty
  std::vector<double> dy;        // [T, H]; may be empty to skip the backward
  // false: leave dw1, dw2, db1, db2 empty (callers that only check rows skip the E*F*H outputs).
  bool compute_weight_grads = true;
};

struct RefLayerOutputs {
  std::vector<double> c;       // [T, 2F] FC1 output after bias
  std::vector<double> y;       // [T, H]
  std::vector<double> dx;      // [T, H]
  std::vector<double> dprobs;  // [T]
  std::vector<double> dw1;     // [E, 2F, H]
  std::vector<double> dw2;     // [E, H, F]
  std::vector<double> db1;     // [E, 2F] when fc1_bias
  std::vector<double> db2;     // [E, H] when fc2_bias
};

RefLayerOutputs reference_layer_f64(const RefLayerInputs& in);

}  // namespace mxmoe::cpu
