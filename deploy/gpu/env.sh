# Sourced by build.sh and check.sh: where the unpacked Debian packages and PyTorch's
# LibTorch live, and the environment that finds them. Sets TOPHAT_GPU_PREFIX, TORCH_CMAKE,
# TORCH_LIB, and exports PATH / LD_LIBRARY_PATH / PKG_CONFIG_* for the build and the tests.
: "${TOPHAT_GPU_PREFIX:=$PWD/build/gpu-prefix}"
multiarch_lib="$TOPHAT_GPU_PREFIX/usr/lib/x86_64-linux-gnu"
python="${PYTHON:-python3}"
TORCH_CMAKE=$("$python" -c 'import torch;print(torch.utils.cmake_prefix_path)')
TORCH_LIB=$("$python" -c 'import os,torch;print(os.path.join(os.path.dirname(torch.__file__),"lib"))')
if [ -d "$multiarch_lib" ]; then
  export PATH="$TOPHAT_GPU_PREFIX/usr/bin:$PATH"
  # The Debian libraries have no RUNPATH, so their own dependencies are found this way.
  export LD_LIBRARY_PATH="$multiarch_lib:$TORCH_LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export PKG_CONFIG_LIBDIR="$multiarch_lib/pkgconfig:$TOPHAT_GPU_PREFIX/usr/share/pkgconfig"
  export PKG_CONFIG_SYSROOT_DIR="$TOPHAT_GPU_PREFIX"
else
  export LD_LIBRARY_PATH="$TORCH_LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
