// The one door from tools/ into the library's internals, beyond the public API (include/mxmoe):
// the layer steps (`mxmoe bench` times them), library-owned buffers, the registry's backend names,
// and the unquantized fp64 reference layer (`mxmoe run`'s sanity check). No other src/ header may
// be included from tools/ (docs/architecture.md "Who may include whom"; tests/check_includes.py).
#pragma once
#include "src/api/layer_plan.h"
#include "src/api/layer_state.h"
#include "src/api/layer_steps.h"
#include "src/common/pool.h"  // mxmoe bench's peaks: the library pool's watermark
#include "src/cpu/reference_f64.h"
#include "src/dispatch/backend.h"
