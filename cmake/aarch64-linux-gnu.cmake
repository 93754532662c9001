# SPDX-License-Identifier: Apache-2.0
# Cross build for AArch64 Linux with g++-aarch64-linux-gnu (Debian: g++-aarch64-linux-gnu, the arm64 multiarch
# libraries libhwy-dev:arm64 libgtest-dev:arm64 libgomp1:arm64; scripts/lanes/arm.sh installs them). Tests run
# through qemu-aarch64-static (CMAKE_CROSSCOMPILING_EMULATOR). The emulated CPU comes from qemu's own QEMU_CPU
# environment variable at run time (qemu-user's default is "max": every feature, 128-bit SVE), so one build
# runs at every SVE vector length, e.g. QEMU_CPU=max,sve-default-vector-length=64 ctest ... for 512-bit SVE
# (the length is in bytes). Never add -L /usr/aarch64-linux-gnu: two glibc builds then mix and every
# pthread_create hangs.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_CROSSCOMPILING_EMULATOR qemu-aarch64-static)
