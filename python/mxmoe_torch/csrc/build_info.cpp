// The facts of this build that mxmoe_torch checks before it loads the library (_build_info.py reads
// them from the file's bytes, so a library that cannot load under the running torch is still read):
// the torch version it was compiled against and the project version (CMake's PROJECT_VERSION, the
// one pyproject.toml repeats). The marker's spelling is what _build_info.py searches for.
#ifndef MXMOE_TORCH_BUILT_WITH
#error "MXMOE_TORCH_BUILT_WITH (torch.__version__ at configure time) is set by python/CMakeLists.txt"
#endif
#ifndef MXMOE_TORCH_PROJECT_VERSION
#error "MXMOE_TORCH_PROJECT_VERSION is set by python/CMakeLists.txt"
#endif

extern "C" {
__attribute__((used, visibility("default"))) extern const char mxmoe_torch_build_info[] =
    "MXMOE_TORCH_BUILD_INFO torch=" MXMOE_TORCH_BUILT_WITH " mxmoe=" MXMOE_TORCH_PROJECT_VERSION ";";
}
