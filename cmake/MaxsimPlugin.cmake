# SPDX-License-Identifier: Apache-2.0
# maxsim_add_plugin(<target> NAME <backend name> SOURCES <files...>
#                   [OUTPUT_DIRECTORY <dir>] [DEFINITIONS <defs...>] [LIBRARIES <libs...>] [EXPORTS_MAP <file>])
# Builds a backend plugin the host can load: a loadable module named libmaxsim-plugin-<name> with the platform's
# suffix (.so, .dylib, .dll: the names lib/src/plugin_host.h looks for), hidden visibility so that only
# maxsim_plugin_entry is exported (plus EXPORTS_MAP, a GNU linker version script, where the linker takes one:
# it also hides a statically linked device runtime), no undefined symbols on Linux, the plugin ABI headers on
# its include path. OUTPUT_DIRECTORY defaults to the build tree's top folder, beside libmaxsim, where the host
# looks first.
function(maxsim_add_plugin target)
  cmake_parse_arguments(P "" "NAME;OUTPUT_DIRECTORY;EXPORTS_MAP" "SOURCES;DEFINITIONS;LIBRARIES" ${ARGN})
  if(NOT P_NAME OR NOT P_SOURCES)
    message(FATAL_ERROR "maxsim_add_plugin(${target}): NAME and SOURCES are required")
  endif()
  if(NOT P_OUTPUT_DIRECTORY)
    set(P_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR})
  endif()
  if(APPLE)
    set(_suffix .dylib)
  elseif(WIN32)
    set(_suffix .dll)
  else()
    set(_suffix .so)
  endif()
  add_library(${target} MODULE ${P_SOURCES})
  target_include_directories(${target} PRIVATE ${MAXSIM_PUBLIC_INCLUDE_DIRS})
  target_compile_definitions(${target} PRIVATE ${P_DEFINITIONS})
  target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:${MAXSIM_WARNINGS}>)
  target_link_libraries(${target} PRIVATE ${P_LIBRARIES})
  set_target_properties(${target} PROPERTIES
    PREFIX "lib"
    OUTPUT_NAME "maxsim-plugin-${P_NAME}"
    SUFFIX ${_suffix}
    LIBRARY_OUTPUT_DIRECTORY ${P_OUTPUT_DIRECTORY}
    RUNTIME_OUTPUT_DIRECTORY ${P_OUTPUT_DIRECTORY}
    C_VISIBILITY_PRESET hidden
    CXX_VISIBILITY_PRESET hidden
    VISIBILITY_INLINES_HIDDEN ON)
  if(CMAKE_SYSTEM_NAME STREQUAL "Linux")
    # Every symbol a plugin uses must resolve at link time, except in a sanitizer build: there the sanitizer
    # runtimes live in the executable that loads the plugin, so a shared module cannot name them itself.
    if(NOT MAXSIM_SANITIZE AND NOT MAXSIM_BUILD_FUZZERS)
      target_link_options(${target} PRIVATE "LINKER:-z,defs")
    endif()
    if(P_EXPORTS_MAP)
      target_link_options(${target} PRIVATE "LINKER:--version-script=${P_EXPORTS_MAP}" "LINKER:--exclude-libs,ALL")
      set_property(TARGET ${target} APPEND PROPERTY LINK_DEPENDS ${P_EXPORTS_MAP})
    endif()
  endif()
endfunction()
