# SPDX-License-Identifier: Apache-2.0
# WebAssembly (wasm32-wasi) with clang-19 and Debian's wasi-libc / libc++ for wasm32 (scripts/setup.sh --wasm):
#   cmake -S . -B build-wasm -G Ninja -DCMAKE_TOOLCHAIN_FILE=cmake/wasm32-wasi.cmake [-DMAXSIM_WASM_RELAXED=ON]
# One module per SIMD level: SIMD128 (every engine with WebAssembly SIMD), or SIMD128 + relaxed SIMD
# (MAXSIM_WASM_RELAXED=ON). No exceptions (the wasm32 libc++ has none), no threads, no dlopen.
# Linking runs without -O: with -O clang calls wasm-opt when binaryen is installed, and binaryen's wasm-opt
# rejects relaxed-SIMD opcodes (the compile steps are optimised; the linker only lays the objects out).
list(APPEND CMAKE_MODULE_PATH ${CMAKE_CURRENT_LIST_DIR})  # Platform/WASI.cmake
set(CMAKE_SYSTEM_NAME WASI)
set(CMAKE_SYSTEM_VERSION 1)
set(CMAKE_SYSTEM_PROCESSOR wasm32)
set(CMAKE_C_COMPILER clang-19)
set(CMAKE_CXX_COMPILER clang++-19)
set(CMAKE_C_COMPILER_TARGET wasm32-wasi)
set(CMAKE_CXX_COMPILER_TARGET wasm32-wasi)
set(CMAKE_SYSROOT /usr)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)
option(MAXSIM_WASM_RELAXED "Build the relaxed-SIMD module (f32x4.relaxed_madd, i32x4.relaxed_dot_i8x16_i7x16_add_s)" OFF)
set(_maxsim_wasm_flags "-msimd128 -fno-exceptions -D_WASI_EMULATED_MMAN -D_WASI_EMULATED_GETPID")
if(MAXSIM_WASM_RELAXED)
  string(APPEND _maxsim_wasm_flags " -mrelaxed-simd")
endif()
set(CMAKE_C_FLAGS_INIT "${_maxsim_wasm_flags}")
set(CMAKE_CXX_FLAGS_INIT "${_maxsim_wasm_flags}")
set(CMAKE_EXE_LINKER_FLAGS_INIT "-Wl,--stack-first -Wl,-z,stack-size=1048576")
set(CMAKE_CXX_STANDARD_LIBRARIES "-lwasi-emulated-mman -lwasi-emulated-getpid")  # after the objects
# Link rules without <FLAGS> (the compile flags, -O included): see the note on wasm-opt above.
set(CMAKE_CXX_LINK_EXECUTABLE
    "<CMAKE_CXX_COMPILER> --target=wasm32-wasi --sysroot=/usr <LINK_FLAGS> <OBJECTS> -o <TARGET> <LINK_LIBRARIES>")
set(CMAKE_C_LINK_EXECUTABLE
    "<CMAKE_C_COMPILER> --target=wasm32-wasi --sysroot=/usr <LINK_FLAGS> <OBJECTS> -o <TARGET> <LINK_LIBRARIES>")
