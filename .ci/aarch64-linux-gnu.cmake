# CMake toolchain for cross-building normd for ARM64 (aarch64) on an x86-64
# Debian 12 host: Debian's g++-aarch64-linux-gnu, the :arm64 dev packages
# beside the host's (multiarch: libraries and CMake configs under
# /usr/lib/aarch64-linux-gnu), and qemu-user-static to run what is built
# (gtest discovery, ctest). The host's protoc and grpc_cpp_plugin generate
# the code. Used by `make test-arm64`.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)
# The CPU model comes from QEMU_CPU (qemu's default is `max`, with SVE).
set(CMAKE_CROSSCOMPILING_EMULATOR /usr/bin/qemu-aarch64-static)
# Never the host's own libraries: find modules and pkg-config look in the
# aarch64 multiarch directories only.
set(CMAKE_IGNORE_PATH /usr/lib/x86_64-linux-gnu /usr/include/x86_64-linux-gnu)
set(ENV{PKG_CONFIG_LIBDIR}
    /usr/lib/aarch64-linux-gnu/pkgconfig:/usr/share/pkgconfig)
