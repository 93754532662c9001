# SPDX-License-Identifier: Apache-2.0
# End-to-end tests of the `maxsim` tool (lib/cli): included from tests/CMakeLists.txt.
if(TARGET maxsim_cli)
  add_executable(maxsim_cli_tests cli_test.cc cli_retrieval_test.cc)
  target_link_libraries(maxsim_cli_tests PRIVATE maxsim_testutil GTest::gtest_main)
  string(JOIN " " _maxsim_cli_emulator ${CMAKE_CROSSCOMPILING_EMULATOR})  # empty in native builds
  target_compile_definitions(maxsim_cli_tests PRIVATE MAXSIM_CLI_PATH="$<TARGET_FILE:maxsim_cli>"
                             MAXSIM_CLI_EMULATOR="${_maxsim_cli_emulator}")
  add_dependencies(maxsim_cli_tests maxsim_cli)
  gtest_discover_tests(maxsim_cli_tests DISCOVERY_TIMEOUT 60 PROPERTIES TIMEOUT 300 LABELS cli)
endif()
