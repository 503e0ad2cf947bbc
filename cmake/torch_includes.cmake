# PyTorch's LibTorch (the CUDA one a GPU server gets with `pip install torch`) ships the
# headers of libraries it bundles beside its own: google/protobuf (an older protobuf) and
# fmt (a newer fmt). As an -isystem directory ahead of Debian's, they shadow the protobuf our
# generated code was made for and the fmt that Debian's spdlog was built with, and the build
# fails (or, worse, links code compiled against mismatched headers). This replaces LibTorch's
# include directory on its imported targets with a directory of links to its own entries
# alone. Debian's CPU LibTorch installs no such headers, so there it does nothing.
function(tophat_isolate_torch_includes)
  # Debian's LibTorch lives in /usr, whose include directory is everyone's: nothing to do.
  # The same for the arm64 cross build, where it lives in the unpacked packages' usr/.
  if(TORCH_INSTALL_PREFIX MATCHES "^/usr(/|$)" OR
     (CMAKE_CROSSCOMPILING AND TORCH_INSTALL_PREFIX MATCHES "/usr$"))
    return()
  endif()
  set(_inc "${TORCH_INSTALL_PREFIX}/include")
  set(_bundled google fmt spdlog nlohmann absl CLI)
  set(_found FALSE)
  foreach(_entry IN LISTS _bundled)
    if(EXISTS "${_inc}/${_entry}")
      set(_found TRUE)
    endif()
  endforeach()
  if(NOT _found)
    return()
  endif()
  set(_farm "${CMAKE_BINARY_DIR}/torch-include")
  file(REMOVE_RECURSE "${_farm}")
  file(MAKE_DIRECTORY "${_farm}")
  file(GLOB _entries RELATIVE "${_inc}" "${_inc}/*")
  set(_skipped "")
  foreach(_entry IN LISTS _entries)
    if(_entry IN_LIST _bundled)
      list(APPEND _skipped "${_entry}")
    else()
      file(CREATE_LINK "${_inc}/${_entry}" "${_farm}/${_entry}" SYMBOLIC)
    endif()
  endforeach()
  message(STATUS "tophat: LibTorch's bundled headers left out of the include path: ${_skipped}")
  foreach(_target torch torch_cpu torch_cuda torch_library c10 c10_cuda caffe2::cudart)
    if(NOT TARGET ${_target})
      continue()
    endif()
    get_target_property(_dirs ${_target} INTERFACE_INCLUDE_DIRECTORIES)
    if(NOT _dirs)
      continue()
    endif()
    list(TRANSFORM _dirs REPLACE "^${_inc}$" "${_farm}")
    set_target_properties(${_target} PROPERTIES INTERFACE_INCLUDE_DIRECTORIES "${_dirs}")
  endforeach()
  set(_dirs ${TORCH_INCLUDE_DIRS})
  list(TRANSFORM _dirs REPLACE "^${_inc}$" "${_farm}")
  set(TORCH_INCLUDE_DIRS "${_dirs}" PARENT_SCOPE)
endfunction()

# PyTorch's wheels are built with a toolchain that links the newer parts of libstdc++
# (std::filesystem among them) statically into libtorch.so and exports them. Loaded ahead of
# the system's libstdc++.so.6, those copies interpose on every later library's calls, and
# std::filesystem::remove_all jumps to a null pointer (seen on a GPU server with PyTorch
# 2.11: every test that removed a temporary directory crashed). Making libstdc++ the first
# library each program needs puts the system's copy first in the lookup order. Debian's own
# LibTorch is built against the system libstdc++ and needs none of this.
function(tophat_put_libstdcxx_first)
  if(TORCH_INSTALL_PREFIX MATCHES "^/usr(/|$)")
    return()
  endif()
  # The shared library by its path: a plain -lstdc++ before the objects did not become the
  # first needed library on the GPU server (its compiler may take the static archive, which
  # contributes nothing that early, and the references then bind to libtorch.so's exports).
  execute_process(COMMAND ${CMAKE_CXX_COMPILER} -print-file-name=libstdc++.so.6
                  OUTPUT_VARIABLE _libstdcxx OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(NOT IS_ABSOLUTE "${_libstdcxx}" OR NOT EXISTS "${_libstdcxx}")
    find_library(_libstdcxx NAMES libstdc++.so.6
                 PATHS /usr/lib/x86_64-linux-gnu /usr/lib/aarch64-linux-gnu /usr/lib64 /lib64)
  endif()
  if(NOT _libstdcxx)
    message(WARNING "tophat: no shared libstdc++.so.6 found; LibTorch's exported copies of "
                    "libstdc++ code may interpose on the system's")
    return()
  endif()
  message(STATUS "tophat: ${_libstdcxx} linked first, ahead of LibTorch's exported copies")
  # A plain flag string, placed before the objects and passed through untouched.
  set(_first "-Wl,--push-state,--no-as-needed ${_libstdcxx} -Wl,--pop-state")
  foreach(_kind EXE SHARED MODULE)
    set(CMAKE_${_kind}_LINKER_FLAGS "${_first} ${CMAKE_${_kind}_LINKER_FLAGS}" PARENT_SCOPE)
  endforeach()
endfunction()
