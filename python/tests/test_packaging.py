"""Packaging: one version (pyproject.toml = CMakeLists.txt = mxmoe_torch.__version__), the torch version
recorded in the extension and checked at import, and `pip install .` failing early, saying what to do,
where torch cannot be imported.

Run: PYTHONPATH=python MXMOE_TORCH_LIBRARY=<build>/python/libmxmoe_torch.so python -m pytest python/tests"""

import os
import pathlib
import re
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch

import mxmoe_torch
from mxmoe_torch import _build_info

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGE_DIR = pathlib.Path(mxmoe_torch.__file__).resolve().parent


def pyproject_version():
    text = (ROOT / "pyproject.toml").read_text()
    try:
        import tomllib
        return tomllib.loads(text)["project"]["version"]
    except ImportError:  # Python < 3.11
        return re.search(r'(?m)^\[project\][^\[]*?^version\s*=\s*"([^"]+)"', text).group(1)


def cmake_version():
    text = (ROOT / "CMakeLists.txt").read_text()
    return re.search(r"project\(\s*mxmoe\s+VERSION\s+([0-9][0-9.]*)", text).group(1)


def test_pyproject_and_cmake_versions_agree():
    assert pyproject_version() == cmake_version()


def test_package_version_is_the_project_version():
    assert mxmoe_torch.__version__ == pyproject_version()
    info = mxmoe_torch.build_info()
    assert info == {"torch": torch.__version__, "mxmoe": cmake_version()}


# ---------------------------------------------------------------- the torch version of the build

def run_import(library, tmp_path):
    """`import mxmoe_torch` in a fresh interpreter with $MXMOE_TORCH_LIBRARY = library."""
    env = dict(os.environ, MXMOE_TORCH_LIBRARY=str(library), PYTHONPATH=str(PACKAGE_DIR.parent))
    code = "import warnings; warnings.simplefilter('always'); import mxmoe_torch; print('IMPORTED')"
    return subprocess.run([sys.executable, "-c", code], env=env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)


def with_torch_version(src, dst, version):
    """A copy of the library whose build record names another torch version (the record rewritten
    in place, NUL-padded to its old length)."""
    data = pathlib.Path(src).read_bytes()
    found = re.search(rb"MXMOE_TORCH_BUILD_INFO torch=[^ \x00]+ mxmoe=([^;\x00]+);", data)
    assert found, "the library has no build record"
    record = b"MXMOE_TORCH_BUILD_INFO torch=" + version.encode() + b" mxmoe=" + found.group(1) + b";"
    assert len(record) <= found.end() - found.start()
    record += b"\x00" * (found.end() - found.start() - len(record))
    pathlib.Path(dst).write_bytes(data[:found.start()] + record + data[found.end():])
    return dst


def test_library_built_for_another_torch_warns_with_both_versions(tmp_path):
    lib = with_torch_version(mxmoe_torch._LIBRARY, tmp_path / "libmxmoe_torch.so", "1.0.0")
    assert _build_info.read(lib)["torch"] == "1.0.0"
    r = run_import(lib, tmp_path)
    assert "IMPORTED" in r.stdout, r.stderr
    assert re.search(rf"built against torch 1\.0\.0, but torch {re.escape(torch.__version__)} is installed",
                     r.stderr), r.stderr
    assert "rebuild" in r.stderr


def test_library_that_does_not_load_under_this_torch_names_both_versions(tmp_path):
    """A library built for another torch typically fails with an undefined C++ symbol; the error
    says which torch it was built for and which is running, and how to rebuild."""
    lib = tmp_path / "libmxmoe_torch.so"
    lib.write_bytes(b"not an ELF file; MXMOE_TORCH_BUILD_INFO torch=2.99.0+cu999 mxmoe=0.1.0;\x00")
    r = run_import(lib, tmp_path)
    assert "IMPORTED" not in r.stdout
    assert "ImportError" in r.stderr, r.stderr
    assert f"built against torch 2.99.0+cu999, but torch {torch.__version__} is installed" in r.stderr, r.stderr
    assert "pip install --no-build-isolation" in r.stderr


def test_library_without_a_record_still_loads_errors_plainly(tmp_path):
    lib = tmp_path / "libmxmoe_torch.so"
    lib.write_bytes(b"not an ELF file")
    assert _build_info.read(lib) == {}
    r = run_import(lib, tmp_path)
    assert "ImportError" in r.stderr and f"cannot load {lib}" in r.stderr, r.stderr


# ---------------------------------------------------------------- pip install . without torch

@pytest.mark.skipif(shutil.which("cmake") is None, reason="cmake is not installed")
def test_skbuild_configure_without_torch_fails_early_saying_what_to_do(tmp_path):
    """What `pip install .` sees under build isolation (torch not importable): CMake stops at
    configure, before compiling anything, with the commands to run."""
    (tmp_path / "notorch").mkdir()
    (tmp_path / "notorch" / "torch.py").write_text("raise ImportError('torch hidden by the test')\n")
    python = tmp_path / "python3"
    python.write_text(textwrap.dedent(f"""\
        #!/bin/sh
        PYTHONPATH={tmp_path / 'notorch'} exec {sys.executable} "$@"
        """))
    python.chmod(0o755)
    r = subprocess.run(["cmake", "-S", str(ROOT), "-B", str(tmp_path / "build"), "-DSKBUILD=ON",
                        "-DMXMOE_WITH_CUDA=OFF", "-DMXMOE_BUILD_TESTS=OFF", f"-DPython3_EXECUTABLE={python}"],
                       capture_output=True, text=True, timeout=300)
    out = r.stdout + r.stderr
    assert r.returncode != 0, out
    assert "PyTorch is not importable" in out, out
    assert "pip install torch scikit-build-core" in out and "pip install --no-build-isolation ." in out, out
