# SPDX-License-Identifier: Apache-2.0
# CMake platform file for CMAKE_SYSTEM_NAME WASI (cmake/wasm32-wasi.cmake puts this folder on the module path):
# static executables (.wasm), no shared libraries.
set(WASI 1)
set(CMAKE_EXECUTABLE_SUFFIX ".wasm")
set(CMAKE_STATIC_LIBRARY_PREFIX "lib")
set(CMAKE_STATIC_LIBRARY_SUFFIX ".a")
set_property(GLOBAL PROPERTY TARGET_SUPPORTS_SHARED_LIBS FALSE)
