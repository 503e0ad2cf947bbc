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

macro(tophat_find_torch)
  set(TOPHAT_TORCH_SITE "")
  set(TOPHAT_TORCH_RUNTIME_DIRS "")
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
