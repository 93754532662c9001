# SPDX-License-Identifier: Apache-2.0
# The wasm32-wasi build (toolchain: cmake/wasm32-wasi.cmake; docs/wasm.md). Included by the top-level
# CMakeLists.txt instead of the host packages: Highway header-only (its one static WASM target, so
# HWY_DYNAMIC_DISPATCH is a direct call), no OpenMP, no threads, no plugins (the plugin host is a stub), no
# shared library, CLI or benchmarks; the module for JavaScript (web/) and the C++ tests run under node.
set(MAXSIM_WASM ON)
set(MAXSIM_OPENMP OFF CACHE BOOL "" FORCE)
set(MAXSIM_BUILD_CLI OFF CACHE BOOL "" FORCE)
set(MAXSIM_BUILD_BENCHMARKS OFF CACHE BOOL "" FORCE)
set(MAXSIM_BUILD_FUZZERS OFF CACHE BOOL "" FORCE)
set(MAXSIM_CUDA OFF CACHE STRING "" FORCE)
set(MAXSIM_INSTALL OFF CACHE BOOL "" FORCE)
# Highway's headers only: a folder holding just a `hwy` link, so that the host's /usr/include (glibc headers)
# never comes before wasi-libc's.
set(_maxsim_hwy_inc ${CMAKE_BINARY_DIR}/hwy-include)
file(MAKE_DIRECTORY ${_maxsim_hwy_inc})
if(NOT EXISTS ${_maxsim_hwy_inc}/hwy)
  file(CREATE_LINK /usr/include/hwy ${_maxsim_hwy_inc}/hwy SYMBOLIC)
endif()
add_library(maxsim_hwy_headers INTERFACE)
target_include_directories(maxsim_hwy_headers SYSTEM INTERFACE ${_maxsim_hwy_inc})
add_library(hwy::hwy ALIAS maxsim_hwy_headers)
add_library(maxsim_no_threads INTERFACE)  # single-threaded: Threads::Threads links nothing
add_library(Threads::Threads ALIAS maxsim_no_threads)
set(MAXSIM_PLUGIN_HOST_SOURCE lib/src/plugin_host_none.cc)  # no dlopen: "no plugins in this build"
set(MAXSIM_PACKING_EXTRA_SOURCES packing/src/wasm_runtime.cc)  # Highway's target list, __cxa_thread_atexit
