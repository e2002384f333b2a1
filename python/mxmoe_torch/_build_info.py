"""What the extension library was built against, read from its bytes before it is loaded
(csrc/build_info.cpp writes the marker), so a library built for another torch is reported with
both versions instead of failing with an undefined-symbol error."""

import mmap
import re
import warnings

_MARKER = re.compile(rb"MXMOE_TORCH_BUILD_INFO torch=([^ \x00]+) mxmoe=([^;\x00]+);")


def read(path):
    """{"torch": version, "mxmoe": version} of the library at `path`, or {} where it has no marker
    (or cannot be read: loading it then reports why)."""
    try:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
            found = _MARKER.search(data)
            groups = found.groups() if found else None
    except (OSError, ValueError):
        return {}
    if not groups:
        return {}
    return {"torch": groups[0].decode(), "mxmoe": groups[1].decode()}


def _rebuild_hint():
    return ("rebuild it against this torch: `pip install --no-build-isolation --force-reinstall --no-deps .` in "
            "the mxmoe checkout, or rebuild the CMake tree that $MXMOE_TORCH_LIBRARY points into (docs/pytorch.md)")


def load(path, torch):
    """torch.ops.load_library(path), saying clearly when the library was built for another torch:
    an ImportError naming both versions where it does not load, a warning where it does."""
    built = read(path).get("torch")
    running = torch.__version__
    try:
        torch.ops.load_library(path)
    except OSError as e:
        if built is not None and built != running:
            raise ImportError(f"mxmoe_torch: {path} was built against torch {built}, but torch {running} is "
                              f"installed, and it does not load under it ({e}); {_rebuild_hint()}") from e
        raise ImportError(f"mxmoe_torch: cannot load {path}: {e}") from e
    if built is not None and built != running:
        warnings.warn(f"mxmoe_torch: {path} was built against torch {built}, but torch {running} is installed; "
                      f"the C++ ABI may differ (crashes, wrong results): {_rebuild_hint()}",
                      RuntimeWarning, stacklevel=3)
