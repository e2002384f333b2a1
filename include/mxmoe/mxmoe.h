// Umbrella header.
#pragma once
#include "mxmoe/context.h"
#include "mxmoe/grouped_mlp.h"
#include "mxmoe/groups.h"
#include "mxmoe/mxfp8_layout.h"
#include "mxmoe/numerics.h"
#include "mxmoe/ops.h"
#include "mxmoe/permute.h"
#include "mxmoe/problem.h"
#include "mxmoe/tensor.h"
#include "mxmoe/types.h"
#include "mxmoe/version.h"
