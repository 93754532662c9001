# SPDX-License-Identifier: Apache-2.0
# Kernel `sme` (lib/src/kernels/arm/sme.cc) in an AArch64 Linux build whose compiler is not clang (the g++ cross
# build): GCC 12 has no SME, so that one file is compiled by clang (>= 18) into an object that joins the library's
# objects. Why this way: one extra object is the least invasive change; the rest of the library keeps its
# compiler and flags, and the build needs no second toolchain file or lane. It is sound because:
#   - the object is built with the library's flags that matter (-ffp-contract=off, hidden visibility, PIC) and
#     SME enabled per function only (target("sme") on the streaming functions), so every inline or template
#     function it shares with the g++ objects (libstdc++, the kernel headers) is baseline AArch64 code of the
#     same ABI, whichever copy the linker keeps;
#   - clang's code for __arm_new("za") / __arm_locally_streaming functions calls the SME ABI support routines
#     (__arm_tpidr2_save, __arm_get_current_vg). They live in compiler-rt's builtins (libgcc has them only from
#     GCC 14): the three archive members that define them (sme-abi.S.o, sme-abi-init.c.o and aarch64.c.o for the
#     CPU-feature words they read) are extracted and linked into libmaxsim like its own objects. Every symbol they
#     define is hidden, so libmaxsim.so exports none of them, and the static archive carries them too;
#   - the kernel is entered only after feature detection (HWCAP2_SME) and only when named (MAXSIM_ISA=sme): the
#     library loads and runs on AArch64 CPUs without SME (the support routines check for SME themselves).
# MAXSIM_SME: AUTO (default: built when clang and compiler-rt's aarch64 builtins are found), ON (required), OFF.
# Sets MAXSIM_SME_OBJECTS (objects to link) and adds MAXSIM_HAVE_SME=1 to maxsim_objects (the kernel-list row).
set(MAXSIM_SME "AUTO" CACHE STRING "Build the explicit-only `sme` kernel on AArch64 Linux: AUTO, ON, OFF")
set(MAXSIM_SME_OBJECTS "")
if(MAXSIM_SME STREQUAL "OFF" OR NOT CMAKE_SYSTEM_NAME STREQUAL "Linux")
  return()
endif()

if(CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
  set(_sme_cxx "${CMAKE_CXX_COMPILER}")
else()
  find_program(MAXSIM_SME_CLANG NAMES clang++-19 clang++-18 clang++ DOC "clang (>= 18) for kernels/arm/sme.cc")
  set(_sme_cxx "${MAXSIM_SME_CLANG}")
endif()
set(_sme_target --target=aarch64-linux-gnu)
set(_sme_builtins "")
if(_sme_cxx)
  execute_process(COMMAND ${_sme_cxx} ${_sme_target} -print-resource-dir OUTPUT_VARIABLE _sme_res
                  OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  foreach(_p lib/linux/libclang_rt.builtins-aarch64.a lib/aarch64-unknown-linux-gnu/libclang_rt.builtins.a)
    if(NOT _sme_builtins AND _sme_res AND EXISTS "${_sme_res}/${_p}")
      set(_sme_builtins "${_sme_res}/${_p}")
    endif()
  endforeach()
endif()
if(NOT _sme_cxx OR NOT _sme_builtins)
  set(_why "needs clang (>= 18) and compiler-rt's aarch64 builtins (Debian: clang-19 libclang-rt-19-dev:arm64)")
  if(MAXSIM_SME STREQUAL "ON")
    message(FATAL_ERROR "MAXSIM_SME=ON: the sme kernel ${_why}")
  endif()
  message(STATUS "libmaxsim: kernel sme not built (${_why})")
  return()
endif()

set(_sme_dir ${PROJECT_BINARY_DIR}/sme)
set(_sme_src ${PROJECT_SOURCE_DIR}/lib/src/kernels/arm/sme.cc)
set(_sme_obj ${_sme_dir}/sme.o)
# Frame records in every function: clang 19 calls __arm_get_current_vg in the prologue of an
# __arm_locally_streaming function without saving the link register first when the function is otherwise a
# leaf (its return then jumps back into itself; seen under qemu); a frame record always saves it.
set(_sme_flags ${_sme_target} -std=c++17 -O2 -DNDEBUG -fPIC -ffp-contract=off -fvisibility=hidden
    -fvisibility-inlines-hidden -fno-omit-frame-pointer -mno-omit-leaf-frame-pointer -Wall -Wextra
    -Wno-unused-parameter)
if(MAXSIM_EDGE)
  list(APPEND _sme_flags -DMAXSIM_EDGE=1 -DHWY_COMPILE_ONLY_STATIC=1)
endif()
set(_sme_incs ${PROJECT_SOURCE_DIR}/lib/src ${PROJECT_SOURCE_DIR}/packing/src ${MAXSIM_PUBLIC_INCLUDE_DIRS})
get_target_property(_sme_hwy_inc hwy::hwy INTERFACE_INCLUDE_DIRECTORIES)
foreach(_d ${_sme_hwy_inc})
  if(NOT _d STREQUAL "/usr/include")  # a system directory clang already searches (after libstdc++'s)
    list(APPEND _sme_incs ${_d})
  endif()
endforeach()
list(TRANSFORM _sme_incs PREPEND -I)
add_custom_command(
  OUTPUT ${_sme_obj}
  COMMAND ${CMAKE_COMMAND} -E make_directory ${_sme_dir}
  COMMAND ${CMAKE_CXX_COMPILER_LAUNCHER} ${_sme_cxx} ${_sme_flags} ${_sme_incs} -MD -MF ${_sme_obj}.d
          -c ${_sme_src} -o ${_sme_obj}
  DEPENDS ${_sme_src}
  DEPFILE ${_sme_obj}.d
  COMMENT "Building the sme kernel with ${_sme_cxx}"
  COMMAND_EXPAND_LISTS VERBATIM)

set(_sme_rt sme-abi.S.o sme-abi-init.c.o aarch64.c.o)
set(_sme_rt_objs "")
foreach(_m ${_sme_rt})
  list(APPEND _sme_rt_objs ${_sme_dir}/rt/${_m})
endforeach()
add_custom_command(
  OUTPUT ${_sme_rt_objs}
  COMMAND ${CMAKE_COMMAND} -E make_directory ${_sme_dir}/rt
  COMMAND ${CMAKE_COMMAND} -E chdir ${_sme_dir}/rt ${CMAKE_AR} x ${_sme_builtins} ${_sme_rt}
  DEPENDS ${_sme_builtins}
  COMMENT "Extracting the SME ABI support routines from ${_sme_builtins}"
  VERBATIM)

set(MAXSIM_SME_OBJECTS ${_sme_obj} ${_sme_rt_objs})
set_source_files_properties(${MAXSIM_SME_OBJECTS} PROPERTIES EXTERNAL_OBJECT TRUE GENERATED TRUE)
target_compile_definitions(maxsim_objects PRIVATE MAXSIM_HAVE_SME=1)
message(STATUS "libmaxsim: kernel sme built with ${_sme_cxx} (SME ABI routines from ${_sme_builtins})")
