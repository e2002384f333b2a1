# cmake --install <build> [--prefix P] installs:
#   include/mxmoe/*.h (with the generated version.h), lib/libmxmoe.so.<version> (+ .so.<ABI>, .so),
#   bin/mxmoe (the CLI), lib/cmake/mxmoe/ (find_package(mxmoe CONFIG) -> mxmoe::mxmoe) and
#   lib/pkgconfig/mxmoe.pc. examples/downstream is a consumer; CTest Packaging.Downstream builds it.
include(CMakePackageConfigHelpers)

set(MXMOE_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/mxmoe CACHE STRING
    "Where find_package(mxmoe CONFIG) files are installed, relative to the prefix")

install(TARGETS mxmoe EXPORT mxmoeTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
set_target_properties(mxmoe_cli PROPERTIES INSTALL_RPATH_USE_LINK_PATH ON)
install(TARGETS mxmoe_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(DIRECTORY include/mxmoe DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} FILES_MATCHING PATTERN "*.h")
install(FILES ${MXMOE_GENERATED_INCLUDE_DIR}/mxmoe/version.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/mxmoe)

install(EXPORT mxmoeTargets NAMESPACE mxmoe:: FILE mxmoeTargets.cmake DESTINATION ${MXMOE_INSTALL_CMAKEDIR})
configure_package_config_file(cmake/mxmoeConfig.cmake.in ${CMAKE_CURRENT_BINARY_DIR}/mxmoeConfig.cmake
                              INSTALL_DESTINATION ${MXMOE_INSTALL_CMAKEDIR})
# 0.x: a new minor version may change the API (and then the ABI version).
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/mxmoeConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/mxmoeConfig.cmake ${CMAKE_CURRENT_BINARY_DIR}/mxmoeConfigVersion.cmake
        DESTINATION ${MXMOE_INSTALL_CMAKEDIR})

# mxmoe.pc, relocatable: the prefix is found from the .pc file's own place (${pcfiledir}), so an
# install with --prefix works without reconfiguring.
set(MXMOE_PC_LIBDIR "${CMAKE_INSTALL_LIBDIR}")
set(MXMOE_PC_INCLUDEDIR "${CMAKE_INSTALL_INCLUDEDIR}")
if(IS_ABSOLUTE "${CMAKE_INSTALL_LIBDIR}")
  set(MXMOE_PC_PREFIX "${CMAKE_INSTALL_PREFIX}")
else()
  file(RELATIVE_PATH MXMOE_PC_PREFIX "/p/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/p")
  string(REGEX REPLACE "/$" "" MXMOE_PC_PREFIX "\${pcfiledir}/${MXMOE_PC_PREFIX}")
  set(MXMOE_PC_LIBDIR "\${prefix}/${CMAKE_INSTALL_LIBDIR}")
endif()
if(NOT IS_ABSOLUTE "${CMAKE_INSTALL_INCLUDEDIR}")
  set(MXMOE_PC_INCLUDEDIR "\${prefix}/${CMAKE_INSTALL_INCLUDEDIR}")
endif()
# Static links only (libmxmoe.so records its own needs): the OpenMP and CUDA runtimes.
set(MXMOE_PC_LIBS_PRIVATE "${OpenMP_CXX_FLAGS}")
if(MXMOE_HAVE_CUDA)
  string(APPEND MXMOE_PC_LIBS_PRIVATE " -L${CUDAToolkit_LIBRARY_DIR} -lcudart")
endif()
configure_file(cmake/mxmoe.pc.in ${CMAKE_CURRENT_BINARY_DIR}/mxmoe.pc @ONLY)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/mxmoe.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
