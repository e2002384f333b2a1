# The two libraries made of the objects of mxmoe_objects (and mxmoe_sm90 / mxmoe_sm100 where they are built); see the
# comment above mxmoe_objects in CMakeLists.txt. Nothing is compiled here, only archived and linked.
set(MXMOE_LIBRARY_OBJECTS $<TARGET_OBJECTS:mxmoe_objects>)
if(TARGET mxmoe_sm90)
  list(APPEND MXMOE_LIBRARY_OBJECTS $<TARGET_OBJECTS:mxmoe_sm90>)
endif()
if(TARGET mxmoe_sm100)
  list(APPEND MXMOE_LIBRARY_OBJECTS $<TARGET_OBJECTS:mxmoe_sm100>)
endif()

# mxmoe_core: every symbol, for the tests, the CLI and the PyTorch extension (not installed). It
# carries the object library's usage requirements: include dirs, OpenMP, CUDA::cudart, MXMOE_WITH_CUDA.
add_library(mxmoe_core STATIC ${MXMOE_LIBRARY_OBJECTS})
target_link_libraries(mxmoe_core PUBLIC mxmoe_objects)
# CUDA_RUNTIME_LIBRARY: the CUDA runtime is CUDA::cudart's shared libcudart, for both libraries and
# what links them (CMake would add its default cudart_static beside it).
set_target_properties(mxmoe_core PROPERTIES LINKER_LANGUAGE CXX POSITION_INDEPENDENT_CODE ON
                                            CUDA_RUNTIME_LIBRARY Shared)

# mxmoe: the installed shared library. Exports the MXMOE_API declarations (the objects hide the
# rest) and, through the version script, nothing else: no weak instantiations of std:: templates.
add_library(mxmoe SHARED ${MXMOE_LIBRARY_OBJECTS})
add_library(mxmoe::mxmoe ALIAS mxmoe)
target_include_directories(mxmoe PUBLIC
  $<BUILD_INTERFACE:${CMAKE_CURRENT_SOURCE_DIR}/include>
  $<BUILD_INTERFACE:${MXMOE_GENERATED_INCLUDE_DIR}>
  $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
# What a caller of the library needs besides it: the OpenMP runtime, and the CUDA runtime where the
# CUDA backends are built (device pointers and cudaStream_t cross the API). The package config file
# finds both (find_dependency).
target_link_libraries(mxmoe PUBLIC OpenMP::OpenMP_CXX)
if(MXMOE_HAVE_CUDA)
  target_link_libraries(mxmoe PUBLIC CUDA::cudart)
endif()
target_link_options(mxmoe PRIVATE "LINKER:--version-script=${CMAKE_CURRENT_SOURCE_DIR}/cmake/mxmoe.map"
                                  "LINKER:--no-undefined")
set_target_properties(mxmoe PROPERTIES
  LINKER_LANGUAGE CXX
  CUDA_RUNTIME_LIBRARY Shared
  VERSION ${PROJECT_VERSION}
  SOVERSION ${MXMOE_ABI_VERSION}
  EXPORT_NAME mxmoe
  LINK_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/cmake/mxmoe.map
  # Keep the CUDA toolkit's library dir (outside the system paths) in the installed RPATH.
  INSTALL_RPATH_USE_LINK_PATH ON)
