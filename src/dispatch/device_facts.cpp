// The device facts dispatch plans with, and the planning target of `mxmoe plan`.
#include "src/dispatch/device_facts.h"

#include "src/dispatch/backend.h"
#include "src/dispatch/context_impl.h"

namespace mxmoe::detail {

namespace {
struct NamedTarget {
  const char* name;
  int major, minor;
  const char* what;
};
// What each name stands for: the compute capability a backend's probe_device decides on.
constexpr NamedTarget kTargets[] = {
    {"sm_80", 8, 0, "a GPU from sm_80 without a faster path (A100)"},
    {"sm_90a", 9, 0, "Hopper (H100, H200)"},
    {"sm_100a", 10, 0, "Blackwell (B200)"},
};
}  // namespace

DeviceFacts facts_for(const Context& ctx, Device d) {
  if (const std::optional<DeviceFacts>& t = ctx.impl().target; t.has_value()) {
    DeviceFacts f = *t;
    f.device = d;
    if (d.type == DeviceType::cuda && f.major == 0) {
      f.ok = false;
      f.problem = "the planning target is the CPU";
    }
    return f;
  }
  if (d.type == DeviceType::cpu) return DeviceFacts{.device = d, .ok = true, .name = "host"};
  DeviceFacts f = cuda_device_facts(d.index);
  f.device = d;
  return f;
}

void set_planning_target(Context& ctx, const std::string& arch) {
  std::string known = "cpu";
  for (const NamedTarget& t : kTargets) known += std::string(", ") + t.name;
  if (arch == "cpu") {
    ctx.impl().target = DeviceFacts{.ok = true, .name = "host", .planned = true};
    ctx.impl().dry_run = true;
    return;
  }
  for (const NamedTarget& t : kTargets) {
    if (arch != t.name) continue;
    ctx.impl().target = DeviceFacts{.ok = true,
                                    .major = t.major,
                                    .minor = t.minor,
                                    .name = std::string(t.what) + ", planned",
                                    .planned = true};
    ctx.impl().dry_run = true;
    return;
  }
  throw Error("arch", "unknown target '" + arch + "' (known: " + known + ")");
}

Probe Backend::probe_device(Device d) const {
  if (d.type == DeviceType::cpu) return probe_device(DeviceFacts{.device = d, .ok = true, .name = "host"});
  DeviceFacts f = cuda_device_facts(d.index);
  f.device = d;
  return probe_device(f);
}

bool planning(const Context& ctx) { return ctx.impl().dry_run; }

Allocator planning_allocator(PlanningMemory& m) {
  Allocator a;
  a.user = &m;
  a.allocate = [](int64_t bytes, Device, void*, void* user) -> void* {
    auto& mem = *static_cast<PlanningMemory*>(user);
    void* p = reinterpret_cast<void*>(mem.next);
    mem.next += static_cast<uintptr_t>((bytes + 255) / 256 * 256 + 256);
    mem.live += bytes;
    if (mem.live > mem.peak) mem.peak = mem.live;
    return p;
  };
  a.release = [](void*, int64_t bytes, Device, void*, void* user) { static_cast<PlanningMemory*>(user)->live -= bytes; };
  return a;
}

}  // namespace mxmoe::detail
