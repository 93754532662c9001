# SPDX-License-Identifier: Apache-2.0
# Cross build for AArch64 Linux with g++-aarch64-linux-gnu (Debian: g++-aarch64-linux-gnu, the arm64 multiarch
# libraries libhwy-dev:arm64 libgtest-dev:arm64 libgomp1:arm64; scripts/setup.sh --arm installs them). Tests run
# through qemu-aarch64-static (CMAKE_CROSSCOMPILING_EMULATOR); MAXSIM_QEMU_CPU picks the emulated CPU, e.g.
# "max,sve-default-vector-length=64" for 512-bit SVE. Never add -L /usr/aarch64-linux-gnu: two glibc builds
# then mix and every pthread_create hangs.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
if(NOT DEFINED MAXSIM_QEMU_CPU)
  set(MAXSIM_QEMU_CPU "max")
endif()
set(CMAKE_CROSSCOMPILING_EMULATOR qemu-aarch64-static;-cpu;${MAXSIM_QEMU_CPU})
