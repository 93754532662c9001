# SPDX-License-Identifier: Apache-2.0
# Install rules (included from the top-level CMakeLists.txt when MAXSIM_INSTALL is ON, the default at top level).
#   <prefix>/lib/libmaxsim.so*, libmaxsim.a           the shared and static libraries
#   <prefix>/include/maxsim/*.h, maxsim.hpp            public headers (+ the generated version.h)
#   <prefix>/bin/maxsim                                the CLI (RPATH $ORIGIN/../lib: runs from any prefix)
#   <prefix>/lib/maxsim/plugins/libmaxsim-plugin-*.so  plugins (the host looks there, relative to libmaxsim.so)
#   <prefix>/lib/cmake/maxsim/                         maxsimConfig.cmake + version file: maxsim::maxsim,
#                                                      maxsim::maxsim_static
#   <prefix>/lib/pkgconfig/maxsim.pc                   pkg-config (Libs.private for static linking)
# Everything is relative to the prefix: the installed tree can be moved (no build paths are baked in).
include(CMakePackageConfigHelpers)

set(MAXSIM_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/maxsim)
set(MAXSIM_PLUGIN_INSTALL_DIR ${CMAKE_INSTALL_LIBDIR}/maxsim/plugins)

install(TARGETS maxsim EXPORT maxsimTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT runtime NAMELINK_COMPONENT dev
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT runtime
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT dev)
# The static archive has its own export set: its link dependencies (Highway, OpenMP, Threads) are looked up
# only by consumers that ask for it, so maxsim::maxsim needs nothing but the installed files.
install(TARGETS maxsim_static EXPORT maxsimStaticTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT dev)
install(FILES lib/include/maxsim/maxsim.h lib/include/maxsim/maxsim.hpp lib/include/maxsim/plugin.h
              packing/include/maxsim/packed_format.h ${PROJECT_BINARY_DIR}/include/maxsim/version.h
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/maxsim COMPONENT dev)

if(TARGET maxsim_cli)
  file(RELATIVE_PATH _maxsim_bin_to_lib ${CMAKE_INSTALL_FULL_BINDIR} ${CMAKE_INSTALL_FULL_LIBDIR})
  set_target_properties(maxsim_cli PROPERTIES INSTALL_RPATH "$ORIGIN/${_maxsim_bin_to_lib}")
  install(TARGETS maxsim_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT runtime)
endif()
if(TARGET maxsim_plugin_cuda)
  install(TARGETS maxsim_plugin_cuda LIBRARY DESTINATION ${MAXSIM_PLUGIN_INSTALL_DIR} COMPONENT runtime)
endif()

install(EXPORT maxsimTargets NAMESPACE maxsim:: DESTINATION ${MAXSIM_CMAKE_DIR} COMPONENT dev)
install(EXPORT maxsimStaticTargets NAMESPACE maxsim:: DESTINATION ${MAXSIM_CMAKE_DIR} COMPONENT dev)
configure_package_config_file(cmake/maxsimConfig.cmake.in ${PROJECT_BINARY_DIR}/maxsimConfig.cmake
                              INSTALL_DESTINATION ${MAXSIM_CMAKE_DIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/maxsimConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)  # 0.x: a minor release may change the API
install(FILES ${PROJECT_BINARY_DIR}/maxsimConfig.cmake ${PROJECT_BINARY_DIR}/maxsimConfigVersion.cmake
        DESTINATION ${MAXSIM_CMAKE_DIR} COMPONENT dev)

# pkg-config: the prefix is computed from the .pc file's own location (${pcfiledir}), so the tree stays movable.
set(MAXSIM_PC_DIR ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
file(RELATIVE_PATH MAXSIM_PC_TO_PREFIX ${CMAKE_INSTALL_PREFIX}/${MAXSIM_PC_DIR} ${CMAKE_INSTALL_PREFIX})
string(REGEX REPLACE "/$" "" MAXSIM_PC_TO_PREFIX "${MAXSIM_PC_TO_PREFIX}")
set(MAXSIM_PC_LIBS_PRIVATE "-lhwy")
if(MAXSIM_OPENMP)
  string(APPEND MAXSIM_PC_LIBS_PRIVATE " ${OpenMP_CXX_FLAGS}")
endif()
string(APPEND MAXSIM_PC_LIBS_PRIVATE " ${CMAKE_THREAD_LIBS_INIT}")
foreach(_lib ${CMAKE_DL_LIBS})
  string(APPEND MAXSIM_PC_LIBS_PRIVATE " -l${_lib}")
endforeach()
string(APPEND MAXSIM_PC_LIBS_PRIVATE " -lstdc++ -lm")
configure_file(cmake/maxsim.pc.in ${PROJECT_BINARY_DIR}/maxsim.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/maxsim.pc DESTINATION ${MAXSIM_PC_DIR} COMPONENT dev)
