#!/usr/bin/env python3
"""Who may include whom (docs/architecture.md "Who may include whom").

Reads every #include of include/, src/, tools/ and python/mxmoe_torch/csrc and prints one line per
violation (file:line: the include, and the rule it breaks); exits 1 when there is any.

Floors, top to bottom; a file may include its own floor and any floor below it, except as noted:
  tools/, python/mxmoe_torch/csrc   the CLI and the PyTorch extension
  src/api (+ include/mxmoe)         entry points
  src/dispatch                      step contract, registry, selection
  src/cpu, src/cuda/*               backends
  src/common                        shared by backends and everything above
  include/mxmoe                     the public API (includes nothing else)

Exceptions and doors:
  - tools/ reaches src/ only through src/api/tooling.h; the PyTorch extension only through
    include/mxmoe.
  - backends implement the step contract of src/dispatch: they may include the CONTRACT headers and
    nothing else of src/dispatch.
  - backends do not include each other; a src/cuda/<sub>/ folder may include src/cuda/common/ and
    the src/cuda/*.h files shared by every CUDA backend.

Run: python3 tests/check_includes.py [REPO_ROOT]   (CTest: IncludeRules)
"""
import os
import re
import sys

SCANNED = ["include", "src", "tools", "python/mxmoe_torch/csrc"]
SOURCE_EXT = (".h", ".hpp", ".cuh", ".c", ".cc", ".cpp", ".cu")
TOOLS_DOOR = "src/api/tooling.h"
CONTRACT = {"src/dispatch/backend.h", "src/dispatch/refusing_backend.h", "src/dispatch/device_facts.h"}
INCLUDE_RE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]')
FLOOR_NAMES = ["include/mxmoe", "src/common", "backend", "src/dispatch", "src/api", "tools"]


def floor_of(path):
    """(floor index, backend name or None) of a repository-relative path; None when not layered."""
    if path.startswith("include/mxmoe/"):
        return 0, None
    if path.startswith("src/common/"):
        return 1, None
    if path.startswith("src/cpu/"):
        return 2, "cpu"
    if path.startswith("src/cuda/"):
        parts = path.split("/")
        sub = parts[2] if len(parts) > 3 else "common"  # src/cuda/*.h: shared by the CUDA backends
        return 2, "cuda/" + sub
    if path.startswith("src/dispatch/"):
        return 3, None
    if path.startswith("src/api/"):
        return 4, None
    if path.startswith("tools/") or path.startswith("python/mxmoe_torch/csrc/"):
        return 5, None
    return None, None


def resolve(root, including, name):
    """Repository-relative path of an #include, or None for a header outside the repository."""
    for base in (os.path.dirname(including), "", "include"):
        candidate = os.path.normpath(os.path.join(base, name))
        # X.in: a header CMake's configure_file generates into the build tree (mxmoe/version.h).
        if os.path.isfile(os.path.join(root, candidate)) or os.path.isfile(os.path.join(root, candidate + ".in")):
            return candidate.replace(os.sep, "/")
    return None


def rule_broken(src, dst):
    """The rule `src` including `dst` breaks, or None."""
    src_floor, src_backend = floor_of(src)
    dst_floor, dst_backend = floor_of(dst)
    if dst_floor is None:
        return "library code includes %s, which is outside the library" % dst
    if src.startswith("python/"):
        if dst_floor != 0 and not dst.startswith("python/mxmoe_torch/csrc/"):
            return "the PyTorch extension uses the public API only (include/mxmoe)"
        return None
    if src.startswith("tools/"):
        if dst_floor != 0 and dst != TOOLS_DOOR and not dst.startswith("tools/"):
            return "tools/ reaches src/ only through %s" % TOOLS_DOOR
        return None
    if dst_floor == 5:
        return "the library never includes tools/ or the PyTorch extension"
    if src_floor == 2 and dst_floor == 3:
        if dst not in CONTRACT:
            return "a backend includes only the step contract of src/dispatch (%s)" % ", ".join(sorted(CONTRACT))
        return None
    if dst_floor > src_floor:
        return "%s is below %s: nothing below includes up" % (FLOOR_NAMES[src_floor], FLOOR_NAMES[dst_floor])
    if src_floor == 2 and dst_floor == 2 and src_backend != dst_backend:
        if src_backend.startswith("cuda/") and dst_backend == "cuda/common":
            return None
        return "backends do not include each other (%s includes %s)" % (src_backend, dst_backend)
    return None


def violations(root):
    found = []
    for top in SCANNED:
        for dirpath, _, files in os.walk(os.path.join(root, top)):
            for f in sorted(files):
                if not f.endswith(SOURCE_EXT):
                    continue
                path = os.path.relpath(os.path.join(dirpath, f), root).replace(os.sep, "/")
                with open(os.path.join(root, path), encoding="utf-8", errors="replace") as fh:
                    for lineno, line in enumerate(fh, 1):
                        m = INCLUDE_RE.match(line)
                        if not m:
                            continue
                        name = m.group(2)
                        dst = resolve(root, path, name)
                        if dst is None:
                            if name.split("/")[0] in ("src", "tools", "tests", "mxmoe"):
                                found.append("%s:%d: #include %s: no such file" % (path, lineno, name))
                            continue
                        why = rule_broken(path, dst)
                        if why:
                            found.append("%s:%d: #include %s: %s" % (path, lineno, name, why))
    return sorted(found)


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    bad = violations(root)
    for v in bad:
        print(v)
    if bad:
        print("%d include(s) break the rules of docs/architecture.md \"Who may include whom\"" % len(bad))
        return 1
    print("include rules hold")
    return 0


if __name__ == "__main__":
    sys.exit(main())
