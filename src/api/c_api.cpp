// The C ABI over the C++ API: translate structs, catch every exception, map it to a status code
// and keep its message for mxmoe_last_error().
#include "mxmoe/c_api.h"

#include <cstddef>
#include <memory>
#include <new>
#include <sstream>
#include <string>

#include "mxmoe/mxmoe.h"

namespace {
// The C allocator callbacks, adapted to mxmoe::Allocator. Every Buffer allocated through it keeps
// a raw pointer to it, so it is shared by the context and every saved / wgrad state whose buffers
// came from it: it lives until the last of them is destroyed, in any order (c_api.h "Lifetimes").
struct AllocBridge {
  mxmoe_alloc_fn alloc = nullptr;
  mxmoe_free_fn free = nullptr;
  void* user = nullptr;
};
void* bridge_alloc(int64_t bytes, mxmoe::Device d, void* stream, void* user) {
  auto* b = static_cast<AllocBridge*>(user);
  return b->alloc(bytes, static_cast<int32_t>(d.type), d.index, stream, b->user);
}
void bridge_free(void* p, int64_t bytes, mxmoe::Device d, void* stream, void* user) {
  auto* b = static_cast<AllocBridge*>(user);
  b->free(p, bytes, static_cast<int32_t>(d.type), d.index, stream, b->user);
}
mxmoe::Options with_bridge(mxmoe::Options o, AllocBridge* b) {
  if (b->alloc) o.allocator = {&bridge_alloc, &bridge_free, b};
  return o;
}
}  // namespace

// Each handle declares its bridges first: constructed before, destroyed after its state's buffers.
struct mxmoe_context_s {
  std::shared_ptr<AllocBridge> bridge;
  mxmoe::Context ctx;
  std::string last_backend;
  mxmoe_context_s(std::shared_ptr<AllocBridge> b, mxmoe::Options o)
      : bridge(std::move(b)), ctx(with_bridge(std::move(o), bridge.get())) {}
};
struct mxmoe_saved_s {
  std::shared_ptr<AllocBridge> bridge;  // the forward's context's: the saved buffers came from it
  mxmoe::SavedState state;
};
struct mxmoe_wgrad_s {
  std::shared_ptr<AllocBridge> forward_bridge;   // x_col / a_col / a moved in from the saved state
  std::shared_ptr<AllocBridge> backward_bridge;  // dy_col / dc_col / dc allocated by the backward
  mxmoe::WgradState state;
};
struct mxmoe_prepared_weights_s {
  std::shared_ptr<AllocBridge> bridge;  // the preparing context's: the quantized copies came from it
  mxmoe::PreparedWeights weights;
};

namespace {

using namespace mxmoe;

thread_local std::string g_last_error;

mxmoe_status fail(mxmoe_status s, const std::string& msg) {
  g_last_error = msg;
  return s;
}

// Runs `f`, mapping exceptions to status codes; nothing escapes.
template <class F>
mxmoe_status guarded(F&& f) {
  try {
    g_last_error.clear();
    f();
    return MXMOE_OK;
  } catch (const OutOfMemoryError& e) {
    return fail(MXMOE_ERROR_OUT_OF_MEMORY, e.what());
  } catch (const Error& e) {
    const std::string& arg = e.argument();
    if (arg == "cuda") return fail(MXMOE_ERROR_CUDA, e.what());
    if (arg == "backend" || (arg == "options.backend" && std::string(e.what()).find("cannot run") != std::string::npos))
      return fail(MXMOE_ERROR_UNAVAILABLE, e.what());
    return fail(MXMOE_ERROR_INVALID_ARGUMENT, e.what());
  } catch (const std::bad_alloc& e) {
    return fail(MXMOE_ERROR_OUT_OF_MEMORY, std::string("memory: a host allocation inside the library failed (") +
                                               e.what() + ")");
  } catch (const std::exception& e) {
    return fail(MXMOE_ERROR_INTERNAL, e.what());
  } catch (...) {
    return fail(MXMOE_ERROR_INTERNAL, "unknown error");
  }
}

void check_struct(size_t got, size_t want, const char* name) {
  if (got < want)
    throw Error(std::string(name) + ".struct_size", "is " + std::to_string(got) + ", this library needs at least " +
                                                        std::to_string(want));
}

void check_enum(int32_t v, int32_t max, const char* name) {
  if (v < 0 || v > max)
    throw Error(name, "value " + std::to_string(v) + " is not a valid enumerator (0.." + std::to_string(max) + ")");
}

TensorView view(const mxmoe_tensor& t, const char* name) {
  if (t.rank == 0 && t.data == nullptr) return {};
  if (t.rank < 0 || t.rank > 3) throw Error(name, "rank " + std::to_string(t.rank) + " must be 0..3");
  check_enum(t.dtype, MXMOE_I64, name);
  check_enum(t.device_type, MXMOE_CUDA, name);
  TensorView v;
  v.data = t.data;
  v.dtype = static_cast<DType>(t.dtype);
  v.rank = t.rank;
  for (int d = 0; d < t.rank; ++d) v.shape[d] = t.shape[d];
  v.device = Device{static_cast<DeviceType>(t.device_type), t.device_index};
  return v;
}

ExpertMatrices experts(const mxmoe_experts& e, const char* name) {
  ExpertMatrices m;
  m.dense = view(e.dense, name);
  m.pointers = view(e.pointers, name);
  if (m.pointers.data) check_enum(e.dtype, MXMOE_I64, (std::string(name) + ".dtype").c_str());
  m.dtype = m.pointers.data ? static_cast<DType>(e.dtype) : m.dense.dtype;
  return m;
}

template <class S, class M>
M appended(const S& s, M S::*member, size_t offset, M fallback);

Problem problem(const mxmoe_problem& p) {
  check_struct(p.struct_size, offsetof(mxmoe_problem, pow2_scales), "problem");  // pow2_scales: appended
  check_enum(p.activation, MXMOE_CLAMPED_SWIGLU, "problem.activation");
  check_enum(p.glu_layout, MXMOE_GLU_INTERLEAVE32, "problem.glu_layout");
  check_enum(p.recipe, MXMOE_RECIPE_FP8_BLOCKWISE, "problem.recipe");
  check_enum(p.weight_layout, MXMOE_WEIGHTS_PER_EXPERT, "problem.weight_layout");
  Problem q;
  q.hidden = p.hidden;
  q.ffn = p.ffn;
  q.experts = p.experts;
  q.activation = p.activation == MXMOE_SWIGLU ? Activation::swiglu : Activation::clamped_swiglu;
  q.clamp = {p.clamp_limit, p.clamp_alpha, p.clamp_linear_offset};
  q.glu_layout = p.glu_layout == MXMOE_GLU_HALVES ? GluLayout::halves : GluLayout::interleave32;
  q.fc1_bias = p.fc1_bias != 0;
  q.fc2_bias = p.fc2_bias != 0;
  q.scale_fc2_bias = p.scale_fc2_bias != 0;
  q.recipe = p.recipe == MXMOE_RECIPE_MXFP8           ? Recipe::mxfp8
             : p.recipe == MXMOE_RECIPE_FP8_BLOCKWISE ? Recipe::fp8_blockwise
                                                      : Recipe::bf16;
  q.pow2_scales = appended(p, &mxmoe_problem::pow2_scales, offsetof(mxmoe_problem, pow2_scales), int32_t{0}) != 0;
  q.weight_layout = p.weight_layout == MXMOE_WEIGHTS_DENSE ? WeightLayout::dense : WeightLayout::per_expert;
  return q;
}

WeightGrads grads(const mxmoe_weight_grads& g) {
  check_struct(g.struct_size, sizeof(mxmoe_weight_grads), "grads");
  WeightGrads w;
  w.dw1 = experts(g.dw1, "grads.dw1");
  w.dw2 = experts(g.dw2, "grads.dw2");
  w.db1 = view(g.db1, "grads.db1");
  w.db2 = view(g.db2, "grads.db2");
  w.accumulate = g.accumulate != 0;
  return w;
}

// A field appended to a config struct after its first version: read only when the caller's
// struct_size covers it, otherwise its default (the caller compiled against an older header).
template <class S, class M>
M appended(const S& s, M S::*member, size_t offset, M fallback) {
  return s.struct_size >= offset + sizeof(M) ? s.*member : fallback;
}

const PreparedWeights* prepared_of(mxmoe_prepared_weights p) { return p ? &p->weights : nullptr; }

// An appended mxmoe_mxfp8 field as a view on `axis` (absent when struct_size does not cover it).
template <class S>
Mxfp8View mxfp8_of(const S& s, mxmoe_mxfp8 S::*member, size_t offset, BlockAxis axis, const std::string& name) {
  const mxmoe_mxfp8 m = appended(s, member, offset, mxmoe_mxfp8{});
  Mxfp8View v;
  v.data = view(m.data, (name + ".data").c_str());
  v.scales = view(m.scales, (name + ".scales").c_str());
  v.axis = axis;
  v.layout = m.swizzled ? ScaleLayout::swizzled : ScaleLayout::compact;
  return v;
}

template <class P>
void require(const P* p, const char* name) {
  if (!p) throw Error(name, "is NULL");
}

}  // namespace

extern "C" {

const char* mxmoe_version(void) { return mxmoe::version(); }
void mxmoe_release_cached_memory(void) { mxmoe::release_cached_memory(); }
const char* mxmoe_last_error(void) { return g_last_error.c_str(); }

mxmoe_status mxmoe_context_create(const mxmoe_options* o, mxmoe_context* out) {
  return guarded([&] {
    require(out, "out");
    *out = nullptr;
    Options opt;
    auto bridge = std::make_shared<AllocBridge>();
    if (o) {
      check_struct(o->struct_size, offsetof(mxmoe_options, check_finite), "options");  // check_finite: appended
      if (o->backend) opt.backend = o->backend;
      if (o->deny) {
        std::stringstream ss(o->deny);
        std::string item;
        while (std::getline(ss, item, ','))
          if (!item.empty()) opt.deny.push_back(item);
      }
      opt.scale_layout = o->swizzled_scales ? ScaleLayout::swizzled : ScaleLayout::compact;
      opt.stream = o->stream;
      if ((o->alloc == nullptr) != (o->free == nullptr))
        throw Error("options.alloc", "alloc and free must both be set or both be NULL");
      *bridge = {o->alloc, o->free, o->alloc_user};
      opt.check_finite =
          appended(*o, &mxmoe_options::check_finite, offsetof(mxmoe_options, check_finite), int32_t{0}) != 0;
    }
    *out = new mxmoe_context_s(std::move(bridge), std::move(opt));
  });
}

void mxmoe_context_destroy(mxmoe_context ctx) { delete ctx; }

const char* mxmoe_context_step_backend(mxmoe_context ctx, const char* step) {
  if (!ctx || !step) return nullptr;
  for (const StepRecord& r : ctx->ctx.report())
    if (r.step == step) {
      ctx->last_backend = r.backend;
      return ctx->last_backend.c_str();
    }
  return nullptr;
}

mxmoe_status mxmoe_forward(mxmoe_context ctx, const mxmoe_problem* p, const mxmoe_forward_args* a,
                           mxmoe_saved* saved_out) {
  return guarded([&] {
    require(ctx, "ctx");
    require(p, "problem");
    require(a, "args");
    require(saved_out, "saved_out");
    *saved_out = nullptr;
    check_struct(a->struct_size, offsetof(mxmoe_forward_args, prepared), "args");
    ForwardArgs f;
    f.x = view(a->x, "x");
    f.offsets.offsets = view(a->offsets, "offsets");
    f.probs = view(a->probs, "probs");
    f.w1 = experts(a->w1, "w1");
    f.b1 = view(a->b1, "b1");
    f.w2 = experts(a->w2, "w2");
    f.b2 = view(a->b2, "b2");
    f.y = view(a->y, "y");
    f.prepared = prepared_of(
        appended(*a, &mxmoe_forward_args::prepared, offsetof(mxmoe_forward_args, prepared), mxmoe_prepared_weights{}));
    f.x_row = mxfp8_of(*a, &mxmoe_forward_args::x_row, offsetof(mxmoe_forward_args, x_row), BlockAxis::row, "x_row");
    f.x_col = mxfp8_of(*a, &mxmoe_forward_args::x_col, offsetof(mxmoe_forward_args, x_col), BlockAxis::col, "x_col");
    const Problem q = problem(*p);
    ctx->ctx.clear_report();
    auto* s = new mxmoe_saved_s{ctx->bridge, forward(ctx->ctx, q, f)};
    *saved_out = s;
  });
}

int64_t mxmoe_saved_bytes(mxmoe_saved saved) { return saved ? saved->state.bytes() : 0; }
void mxmoe_saved_destroy(mxmoe_saved saved) { delete saved; }

mxmoe_status mxmoe_backward(mxmoe_context ctx, mxmoe_saved saved, const mxmoe_backward_args* a,
                            mxmoe_wgrad* wgrad_out) {
  return guarded([&] {
    require(ctx, "ctx");
    require(saved, "saved");
    require(a, "args");
    if (wgrad_out) *wgrad_out = nullptr;
    check_struct(a->struct_size, offsetof(mxmoe_backward_args, prepared), "args");
    if (a->deferred_wgrad && !wgrad_out) throw Error("wgrad_out", "is NULL but deferred_wgrad is set");
    BackwardArgs b;
    b.dy = view(a->dy, "dy");
    b.dx = view(a->dx, "dx");
    b.dprobs = view(a->dprobs, "dprobs");
    b.grads = grads(a->grads);
    b.wgrad = a->deferred_wgrad ? WgradMode::deferred : WgradMode::now;
    b.prepared = prepared_of(appended(*a, &mxmoe_backward_args::prepared, offsetof(mxmoe_backward_args, prepared),
                                      mxmoe_prepared_weights{}));
    WgradState w = backward(ctx->ctx, saved->state, b);
    if (a->deferred_wgrad) *wgrad_out = new mxmoe_wgrad_s{saved->bridge, ctx->bridge, std::move(w)};
  });
}

mxmoe_status mxmoe_compute_wgrad(mxmoe_context ctx, mxmoe_wgrad wgrad, const mxmoe_weight_grads* g) {
  return guarded([&] {
    require(ctx, "ctx");
    require(wgrad, "wgrad");
    require(g, "grads");
    compute_wgrad(ctx->ctx, wgrad->state, grads(*g));
  });
}

void mxmoe_wgrad_destroy(mxmoe_wgrad wgrad) { delete wgrad; }

mxmoe_status mxmoe_prepare_weights(mxmoe_context ctx, const mxmoe_problem* p, const mxmoe_experts* w1,
                                   const mxmoe_experts* w2, mxmoe_prepared_weights* out) {
  return guarded([&] {
    require(ctx, "ctx");
    require(p, "problem");
    require(w1, "w1");
    require(w2, "w2");
    require(out, "out");
    *out = nullptr;
    const Problem q = problem(*p);
    const WeightsArgs w{.w1 = experts(*w1, "w1"), .w2 = experts(*w2, "w2")};
    ctx->ctx.clear_report();
    *out = new mxmoe_prepared_weights_s{ctx->bridge, prepare_weights(ctx->ctx, q, w)};
  });
}

int64_t mxmoe_prepared_weights_bytes(mxmoe_prepared_weights prepared) {
  return prepared ? prepared->weights.bytes() : 0;
}
void mxmoe_prepared_weights_destroy(mxmoe_prepared_weights prepared) { delete prepared; }

int64_t mxmoe_permuted_rows_bound(int64_t tokens, int64_t top_k, int64_t experts, int64_t capacity) {
  int64_t rows = -1;
  guarded([&] { rows = permuted_rows_bound(tokens, top_k, experts, capacity); });
  return rows;
}

mxmoe_status mxmoe_permute_tokens(mxmoe_context ctx, const mxmoe_permute_args* a) {
  return guarded([&] {
    require(ctx, "ctx");
    require(a, "args");
    check_struct(a->struct_size, offsetof(mxmoe_permute_args, zero_unused_rows), "args");  // appended
    const PermuteArgs p{.x = view(a->x, "x"),
                        .expert_ids = view(a->expert_ids, "expert_ids"),
                        .probs = view(a->probs, "probs"),
                        .experts = a->experts,
                        .capacity = a->capacity,
                        .offsets = view(a->offsets, "offsets"),
                        .permuted_x = view(a->permuted_x, "permuted_x"),
                        .row_map = view(a->row_map, "row_map"),
                        .permuted_probs = view(a->permuted_probs, "permuted_probs"),
                        .invalid = view(a->invalid, "invalid"),
                        .zero_unused_rows = appended(*a, &mxmoe_permute_args::zero_unused_rows,
                                                     offsetof(mxmoe_permute_args, zero_unused_rows), int32_t{0}) != 0,
                        .rowwise = mxfp8_of(*a, &mxmoe_permute_args::rowwise, offsetof(mxmoe_permute_args, rowwise),
                                            BlockAxis::row, "rowwise"),
                        .colwise = mxfp8_of(*a, &mxmoe_permute_args::colwise, offsetof(mxmoe_permute_args, colwise),
                                            BlockAxis::col, "colwise")};
    ctx->ctx.clear_report();
    permute_tokens(ctx->ctx, p);
  });
}

mxmoe_status mxmoe_unpermute_tokens(mxmoe_context ctx, const mxmoe_unpermute_args* a) {
  return guarded([&] {
    require(ctx, "ctx");
    require(a, "args");
    check_struct(a->struct_size, sizeof(mxmoe_unpermute_args), "args");
    const UnpermuteArgs u{.permuted_y = view(a->permuted_y, "permuted_y"),
                          .row_map = view(a->row_map, "row_map"),
                          .permuted_probs = view(a->permuted_probs, "permuted_probs"),
                          .y = view(a->y, "y"),
                          .probs = view(a->probs, "probs")};
    ctx->ctx.clear_report();
    unpermute_tokens(ctx->ctx, u);
  });
}

mxmoe_status mxmoe_permute_by_map(mxmoe_context ctx, const mxmoe_permute_by_map_args* a) {
  return guarded([&] {
    require(ctx, "ctx");
    require(a, "args");
    check_struct(a->struct_size, offsetof(mxmoe_permute_by_map_args, zero_unused_rows), "args");  // appended
    const PermuteByMapArgs m{.x = view(a->x, "x"),
                             .row_map = view(a->row_map, "row_map"),
                             .probs = view(a->probs, "probs"),
                             .permuted_x = view(a->permuted_x, "permuted_x"),
                             .permuted_probs = view(a->permuted_probs, "permuted_probs"),
                             .zero_unused_rows = appended(*a, &mxmoe_permute_by_map_args::zero_unused_rows,
                                                          offsetof(mxmoe_permute_by_map_args, zero_unused_rows),
                                                          int32_t{0}) != 0};
    ctx->ctx.clear_report();
    permute_by_map(ctx->ctx, m);
  });
}

}  // extern "C"
