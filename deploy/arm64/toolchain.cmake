# CMake toolchain for cross-building tophat for aarch64 (Jetson-class devices) with Debian's
# cross compiler (g++-aarch64-linux-gnu) against Debian's arm64 packages unpacked into a
# directory (deploy/arm64/sysroot.sh makes it). The C library and libstdc++ come from the
# cross toolchain (/usr/aarch64-linux-gnu); every other library, header and CMake package
# config comes from that directory. Tests run under qemu-aarch64 (user-mode emulation).
#
#   cmake --preset arm64      (the preset sets TOPHAT_ARM64_ROOT to build/arm64-root)
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)

if(NOT TOPHAT_ARM64_ROOT)
  set(TOPHAT_ARM64_ROOT "$ENV{TOPHAT_ARM64_ROOT}")
endif()
if(NOT TOPHAT_ARM64_ROOT OR NOT EXISTS "${TOPHAT_ARM64_ROOT}/usr/lib/aarch64-linux-gnu")
  message(FATAL_ERROR "TOPHAT_ARM64_ROOT='${TOPHAT_ARM64_ROOT}' holds no arm64 packages; "
                      "make it with: bash deploy/arm64/sysroot.sh")
endif()
# Passed on to try_compile projects, which re-read this file.
list(APPEND CMAKE_TRY_COMPILE_PLATFORM_VARIABLES TOPHAT_ARM64_ROOT)

set(CMAKE_FIND_ROOT_PATH "${TOPHAT_ARM64_ROOT}" /usr/aarch64-linux-gnu)
# Programs (protoc, grpc_cpp_plugin, pkg-config) are the build machine's own.
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)

# LibTorch: PyTorch's aarch64 wheel, the CPU half, unpacked by deploy/arm64/torch.sh
# (cmake/find_torch.cmake makes its targets).
set(TOPHAT_TORCH_ROOT "${TOPHAT_ARM64_ROOT}/opt/torch-aarch64")
list(APPEND CMAKE_TRY_COMPILE_PLATFORM_VARIABLES TOPHAT_TORCH_ROOT)
# A few arm64 packages (gloo) put their libraries in /usr/lib itself.
set(_arm64_libdirs "${TOPHAT_ARM64_ROOT}/usr/lib/aarch64-linux-gnu"
                   "${TOPHAT_ARM64_ROOT}/lib/aarch64-linux-gnu"
                   "${TOPHAT_ARM64_ROOT}/usr/lib"
                   "${TOPHAT_TORCH_ROOT}/torch/lib"
                   "${TOPHAT_TORCH_ROOT}/nvidia/cu13/lib")
# The headers of the unpacked packages; the libraries' own dependencies are resolved at link
# time through -rpath-link (they are not on the cross linker's default path).
# Debian's multiarch header directory (openssl/opensslconf.h and the like) first.
set(_arm64_includes "-isystem ${TOPHAT_ARM64_ROOT}/usr/include/aarch64-linux-gnu -isystem ${TOPHAT_ARM64_ROOT}/usr/include")
set(CMAKE_C_FLAGS_INIT "${_arm64_includes}")
set(CMAKE_CXX_FLAGS_INIT "${_arm64_includes}")
set(_rpath_link "")
foreach(_dir IN LISTS _arm64_libdirs)
  string(APPEND _rpath_link " -Wl,-rpath-link,${_dir}")
endforeach()
set(CMAKE_EXE_LINKER_FLAGS_INIT "${_rpath_link}")
set(CMAKE_SHARED_LINKER_FLAGS_INIT "${_rpath_link}")
set(CMAKE_MODULE_LINKER_FLAGS_INIT "${_rpath_link}")

# pkg-config reads the arm64 .pc files and prefixes their paths with the root.
set(ENV{PKG_CONFIG_LIBDIR}
    "${TOPHAT_ARM64_ROOT}/usr/lib/aarch64-linux-gnu/pkgconfig:${TOPHAT_ARM64_ROOT}/usr/share/pkgconfig")
set(ENV{PKG_CONFIG_SYSROOT_DIR} "${TOPHAT_ARM64_ROOT}")

# Test binaries (and Catch2's test discovery) run under user-mode emulation: the cross
# toolchain's dynamic loader and C library, then the unpacked libraries.
string(REPLACE ";" ":" _arm64_library_path "${_arm64_libdirs}")
set(CMAKE_CROSSCOMPILING_EMULATOR
    qemu-aarch64 -L /usr/aarch64-linux-gnu -E "LD_LIBRARY_PATH=${_arm64_library_path}")
