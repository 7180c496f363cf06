# Cross build for aarch64 Linux with Debian's g++-aarch64-linux-gnu; the tests run under
# qemu-user (CMAKE_CROSSCOMPILING_EMULATOR, which ctest and gtest_discover_tests use).
#   cmake --preset aarch64        (or -DCMAKE_TOOLCHAIN_FILE=cmake/toolchain-aarch64.cmake)
# bash .ci/test aarch64 installs the packages and runs the tests.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)

set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)
set(CMAKE_CROSSCOMPILING_EMULATOR qemu-aarch64 -L /usr/aarch64-linux-gnu)

# Libraries and C headers come from the cross sysroot only; programs from the build machine.
set(CMAKE_FIND_ROOT_PATH /usr/aarch64-linux-gnu)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
# Eigen, xsimd and CLI11 are header-only and architecture-independent: the build machine's
# packages serve the target (their CMake configs are found on the host, hence BOTH).
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE BOTH)
set(xsimd_DIR /usr/lib/x86_64-linux-gnu/cmake/xsimd CACHE PATH "xsimd's CMake config (host package)")
# Their headers sit in /usr/include beside the build machine's C library headers. -idirafter
# searches it after the cross sysroot, so only names the sysroot lacks (xsimd/, CLI/) resolve
# there; CMake sees /usr/include as an implicit directory of this compiler and therefore
# drops the -isystem /usr/include of the xsimd target, which would shadow the sysroot's.
# -Wno-psabi: GCC notes that passing std::pair changed ABI in GCC 10.1, on every such
# function; everything here is built by one compiler.
set(CMAKE_CXX_FLAGS_INIT "-idirafter /usr/include -Wno-psabi")
set(CMAKE_C_FLAGS_INIT "-idirafter /usr/include")
