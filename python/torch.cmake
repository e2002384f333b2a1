# Finds PyTorch through the Python interpreter that imports it (torch.utils.cmake_prefix_path).
# Sets MXMOE_TORCH_FOUND (MXMOE_TORCH_WHY says why not, where known); on success also MXMOE_TORCH_LIBRARIES, MXMOE_TORCH_CXX_FLAGS,
# MXMOE_TORCH_CUDA (torch is a CUDA build), MXMOE_TORCH_VERSION (torch.__version__, compiled into the
# extension, which checks it at import) and MXMOE_PYTHON. find_package(Torch) runs inside a
# function so that its many variables stay out of the project's scope (its imported targets do not).
function(mxmoe_find_torch)
  set(MXMOE_TORCH_FOUND OFF PARENT_SCOPE)
  find_package(Python3 COMPONENTS Interpreter QUIET)
  if(NOT Python3_Interpreter_FOUND)
    return()
  endif()
  execute_process(
    COMMAND "${Python3_EXECUTABLE}" -c
            "import torch; print(torch.utils.cmake_prefix_path); print(int(torch.version.cuda is not None)); print(torch.__version__)"
    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_QUIET OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(NOT rc EQUAL 0)
    return()
  endif()
  string(REPLACE "\n" ";" out "${out}")
  list(GET out 0 prefix)
  list(GET out 1 torch_cuda)
  list(GET out 2 torch_version)
  if(torch_cuda)
    # Torch's CMake config of a CUDA build fails hard without the CUDA toolkit: look first.
    find_package(CUDAToolkit QUIET)
    if(NOT CUDAToolkit_FOUND)
      set(MXMOE_TORCH_WHY " (PyTorch is a CUDA build and the CUDA toolkit was not found)" PARENT_SCOPE)
      return()
    endif()
  endif()
  if(torch_cuda AND NOT DEFINED TORCH_CUDA_ARCH_LIST AND NOT DEFINED ENV{TORCH_CUDA_ARCH_LIST})
    # Unset, torch's config compiles and runs a GPU probe (fails without a GPU). The extension has
    # no device code, so mxmoe's own list ("80;90a" -> "8.0;9.0a") is only a formality.
    string(REGEX REPLACE "([0-9])([0-9][a-z]?)" "\\1.\\2" TORCH_CUDA_ARCH_LIST "${MXMOE_CUDA_ARCHS}")
  endif()
  list(APPEND CMAKE_PREFIX_PATH "${prefix}")
  find_package(Torch QUIET)
  if(NOT Torch_FOUND)
    return()
  endif()
  set(MXMOE_TORCH_FOUND ON PARENT_SCOPE)
  set(MXMOE_TORCH_VERSION "${torch_version}" PARENT_SCOPE)
  # CUDA tensors are served where both torch and mxmoe have CUDA (else the ops say they cannot).
  if(torch_cuda AND MXMOE_HAVE_CUDA)
    set(MXMOE_TORCH_CUDA ON PARENT_SCOPE)
  endif()
  set(MXMOE_TORCH_LIBRARIES "${TORCH_LIBRARIES}" PARENT_SCOPE)
  set(MXMOE_TORCH_CXX_FLAGS "${TORCH_CXX_FLAGS}" PARENT_SCOPE)
  set(MXMOE_PYTHON "${Python3_EXECUTABLE}" PARENT_SCOPE)
endfunction()

set(MXMOE_TORCH_FOUND OFF)
set(MXMOE_TORCH_WHY "")
set(MXMOE_TORCH_PROBED OFF)
if(NOT DEFINED MXMOE_BUILD_TORCH OR MXMOE_BUILD_TORCH)
  set(MXMOE_TORCH_PROBED ON)
  mxmoe_find_torch()
endif()

# `pip install .` (scikit-build-core sets SKBUILD) exists to build the extension: without torch it
# stops here, before anything compiles, saying what to do. pip's default build isolation runs this in
# a fresh environment without the installed torch, and the extension must be built against that one.
if(SKBUILD AND MXMOE_TORCH_PROBED AND NOT MXMOE_TORCH_FOUND)
  if(MXMOE_TORCH_WHY STREQUAL "")
    set(why "PyTorch is not importable by ${Python3_EXECUTABLE}")
  else()
    set(why "PyTorch cannot be built against${MXMOE_TORCH_WHY}")
  endif()
  message(FATAL_ERROR
    "mxmoe-torch: ${why}. "
    "The extension builds against the torch installed in the target environment, so install torch "
    "first and build without pip's build isolation (which hides it):\n"
    "    pip install torch scikit-build-core\n"
    "    pip install --no-build-isolation .\n"
    "(docs/pytorch.md, Build)")
endif()
