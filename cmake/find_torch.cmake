# LibTorch for every x86-64 build: PyTorch's, from the virtual environment that
# deploy/install-deps.sh makes (deploy/python-env.sh; $TOPHAT_VENV, default
# ~/.cache/tophat/venv). The GPU servers carry the same PyTorch, so what CI builds and tests
# is what runs there. A cross build (deploy/arm64) finds its LibTorch through its toolchain
# file instead; -DTorch_DIR=... points any build at another LibTorch.
#
# Sets TOPHAT_TORCH_SITE (the site-packages folder holding torch/, empty when LibTorch came
# from elsewhere) and TOPHAT_TORCH_RUNTIME_DIRS (the folders of the CUDA libraries PyTorch's
# wheel depends on: nvidia/*/lib), then finds Torch.
set(TOPHAT_TORCH_VERSION "2.11.0" CACHE STRING
    "The LibTorch version the build requires (empty: any)")

function(_tophat_default_python out)
  if(DEFINED ENV{TOPHAT_VENV})
    set(_venv "$ENV{TOPHAT_VENV}")
  else()
    set(_venv "$ENV{HOME}/.cache/tophat/venv")
  endif()
  set(${out} "${_venv}/bin/python3" PARENT_SCOPE)
endfunction()

# A cross build's LibTorch: the CPU libraries of PyTorch's wheel for the target, unpacked
# into TOPHAT_TORCH_ROOT (deploy/arm64/torch.sh). PyTorch's own CMake config cannot be
# used there: the aarch64 wheel is built with CUDA, and the config then looks for a CUDA
# toolkit of the target. The agent and the rest of the tree need LibTorch's CPU library,
# c10 and the headers, which these targets name.
function(_tophat_torch_from_wheel root)
  set(_torch "${root}/torch")
  if(NOT EXISTS "${_torch}/lib/libtorch_cpu.so")
    message(FATAL_ERROR "tophat: no LibTorch in ${_torch} (deploy/arm64/torch.sh unpacks it)")
  endif()
  include("${_torch}/share/cmake/Torch/TorchConfigVersion.cmake")
  set(Torch_VERSION "${PACKAGE_VERSION}" PARENT_SCOPE)
  set(Torch_DIR "${_torch}/share/cmake/Torch" PARENT_SCOPE)
  foreach(_lib torch_cpu c10)
    add_library(${_lib} SHARED IMPORTED GLOBAL)
    set_target_properties(${_lib} PROPERTIES IMPORTED_LOCATION "${_torch}/lib/lib${_lib}.so")
  endforeach()
  add_library(torch INTERFACE IMPORTED GLOBAL)
  set_target_properties(torch PROPERTIES
    INTERFACE_LINK_LIBRARIES "torch_cpu;c10"
    INTERFACE_INCLUDE_DIRECTORIES "${_torch}/include;${_torch}/include/torch/csrc/api/include"
    INTERFACE_COMPILE_DEFINITIONS "_GLIBCXX_USE_CXX11_ABI=1")
  set(TORCH_LIBRARIES torch PARENT_SCOPE)
  set(TORCH_CXX_FLAGS "-D_GLIBCXX_USE_CXX11_ABI=1" PARENT_SCOPE)
  set(TORCH_INSTALL_PREFIX "${_torch}" PARENT_SCOPE)
  set(TORCH_INCLUDE_DIRS "${_torch}/include;${_torch}/include/torch/csrc/api/include" PARENT_SCOPE)
  set(Torch_FOUND TRUE PARENT_SCOPE)
endfunction()

macro(tophat_find_torch)
  set(TOPHAT_TORCH_SITE "")
  set(TOPHAT_TORCH_RUNTIME_DIRS "")
  if(CMAKE_CROSSCOMPILING AND TOPHAT_TORCH_ROOT)
    _tophat_torch_from_wheel("${TOPHAT_TORCH_ROOT}")
    if(TOPHAT_TORCH_VERSION AND NOT Torch_VERSION VERSION_EQUAL TOPHAT_TORCH_VERSION)
      message(FATAL_ERROR "tophat: LibTorch ${Torch_VERSION} in ${TOPHAT_TORCH_ROOT}, "
                          "${TOPHAT_TORCH_VERSION} required: rerun deploy/arm64/torch.sh")
    endif()
    message(STATUS "tophat: LibTorch ${Torch_VERSION} (CPU libraries) from ${TOPHAT_TORCH_ROOT}")
  else()
    _tophat_find_torch_config()
  endif()
endmacro()

macro(_tophat_find_torch_config)
  if(NOT DEFINED Torch_DIR AND NOT CMAKE_CROSSCOMPILING)
    _tophat_default_python(_tophat_python_default)
    set(TOPHAT_PYTHON "${_tophat_python_default}" CACHE FILEPATH
        "The Python whose PyTorch provides LibTorch (deploy/python-env.sh makes it)")
    if(NOT EXISTS "${TOPHAT_PYTHON}")
      message(FATAL_ERROR
        "tophat: no Python environment at ${TOPHAT_PYTHON}: LibTorch comes from PyTorch "
        "${TOPHAT_TORCH_VERSION} in a virtual environment. Run `bash deploy/install-deps.sh` "
        "(or deploy/python-env.sh), set TOPHAT_VENV, or pass -DTOPHAT_PYTHON=... or "
        "-DTorch_DIR=...")
    endif()
    # Where torch/ is, without importing it (an import takes seconds and loads CUDA).
    execute_process(
      COMMAND "${TOPHAT_PYTHON}" -c
        "import importlib.util as u; s = u.find_spec('torch'); print(s.submodule_search_locations[0] if s else '')"
      OUTPUT_VARIABLE _tophat_torch_pkg OUTPUT_STRIP_TRAILING_WHITESPACE
      RESULT_VARIABLE _tophat_rc)
    if(NOT _tophat_rc EQUAL 0 OR NOT _tophat_torch_pkg)
      message(FATAL_ERROR "tophat: ${TOPHAT_PYTHON} has no PyTorch; run `bash deploy/install-deps.sh`")
    endif()
    get_filename_component(TOPHAT_TORCH_SITE "${_tophat_torch_pkg}" DIRECTORY)
    set(Torch_DIR "${_tophat_torch_pkg}/share/cmake/Torch")
    file(GLOB TOPHAT_TORCH_RUNTIME_DIRS LIST_DIRECTORIES true "${TOPHAT_TORCH_SITE}/nvidia/*/lib")
    # The CUDA libraries a process loads are the wheel's, as on a GPU server with this
    # PyTorch: one libcudart or libnccl per process, and the toolkit's (linked by the
    # kernels' CUDA::cudart) would otherwise come first in the build tree's search path.
    list(PREPEND CMAKE_BUILD_RPATH ${TOPHAT_TORCH_RUNTIME_DIRS})
  endif()
  # PyTorch's CUDA config would probe the visible GPU for its own (unused here) nvcc flags,
  # and it replaces CMAKE_CUDA_ARCHITECTURES with OFF (PyTorch issue 172034), which would
  # leave our kernels as nvcc's default target: kept and put back below.
  if(NOT DEFINED TORCH_CUDA_ARCH_LIST AND NOT DEFINED ENV{TORCH_CUDA_ARCH_LIST})
    set(TORCH_CUDA_ARCH_LIST "9.0")
  endif()
  set(_tophat_had_cuda_architectures FALSE)
  if(DEFINED CMAKE_CUDA_ARCHITECTURES)
    set(_tophat_had_cuda_architectures TRUE)
    set(_tophat_cuda_architectures "${CMAKE_CUDA_ARCHITECTURES}")
    unset(CMAKE_CUDA_ARCHITECTURES)
    unset(CMAKE_CUDA_ARCHITECTURES CACHE)
  endif()
  find_package(Torch REQUIRED)
  if(_tophat_had_cuda_architectures)
    set(CMAKE_CUDA_ARCHITECTURES "${_tophat_cuda_architectures}" CACHE STRING
        "CUDA architectures of the kernels" FORCE)
    set(CMAKE_CUDA_ARCHITECTURES "${_tophat_cuda_architectures}")
  endif()
  if(TOPHAT_TORCH_VERSION AND NOT Torch_VERSION VERSION_EQUAL TOPHAT_TORCH_VERSION)
    message(FATAL_ERROR
      "tophat: LibTorch ${Torch_VERSION} found (${Torch_DIR}), ${TOPHAT_TORCH_VERSION} "
      "required: run `bash deploy/install-deps.sh`, or pass -DTOPHAT_TORCH_VERSION= to build "
      "against another version")
  endif()
  message(STATUS "tophat: LibTorch ${Torch_VERSION} from ${Torch_DIR}")
endmacro()
