# Precompiled LibTorch headers. <ATen/ATen.h> alone takes ~10 s to parse on the CI machine
# and well over a hundred of the tree's C++ files read it, which made it half of a 2-core
# build's compile time. Parsed once per build tree instead, and reused by every target that
# sees LibTorch's headers (those that link `torch`, directly or through a library that
# passes it on).
#
# GCC uses a precompiled header only when it was made with the same -fPIC/-fPIE as the file
# that includes it (libraries and executables get one each) and the same predefined macros:
# -pthread, which gRPC's and Abseil's targets pass on, defines _REENTRANT, so every file that
# uses the header is compiled with -pthread (it defines nothing else). -Winvalid-pch makes a
# rejected header a visible warning rather than a silent slow build.
option(TOPHAT_PCH "Precompile the LibTorch headers once per build tree" ON)

# Does `target`'s own compilation see LibTorch's headers?
function(_tophat_sees_torch target out)
  get_target_property(_libs ${target} LINK_LIBRARIES)
  _tophat_any_exports_torch("${_libs}" _found)
  set(${out} ${_found} PARENT_SCOPE)
endfunction()

# Does any of `libs` pass LibTorch's headers on to its dependents?
function(_tophat_any_exports_torch libs out)
  set(_found FALSE)
  foreach(_lib IN LISTS libs)
    if(_lib STREQUAL "torch" OR _lib STREQUAL "torch_library")
      set(_found TRUE)
      break()
    endif()
    if(TARGET ${_lib} AND _lib MATCHES "^tophat_")
      get_target_property(_interface ${_lib} INTERFACE_LINK_LIBRARIES)
      if(_interface)
        _tophat_any_exports_torch("${_interface}" _found)
        if(_found)
          break()
        endif()
      endif()
    endif()
  endforeach()
  set(${out} ${_found} PARENT_SCOPE)
endfunction()

function(_tophat_targets_under dir out)
  get_property(_targets DIRECTORY ${dir} PROPERTY BUILDSYSTEM_TARGETS)
  get_property(_subdirs DIRECTORY ${dir} PROPERTY SUBDIRECTORIES)
  foreach(_sub IN LISTS _subdirs)
    _tophat_targets_under(${_sub} _more)
    list(APPEND _targets ${_more})
  endforeach()
  set(${out} ${_targets} PARENT_SCOPE)
endfunction()

# Call once, after every target is defined.
function(tophat_precompile_torch_headers)
  if(NOT TOPHAT_PCH)
    return()
  endif()
  set(_source ${PROJECT_SOURCE_DIR}/cmake/torch_pch.cc)
  add_library(tophat_torch_pch_pic OBJECT ${_source})
  add_executable(tophat_torch_pch_pie ${_source})
  set_target_properties(tophat_torch_pch_pie PROPERTIES EXCLUDE_FROM_ALL TRUE)
  # A third for the targets compiled with OpenMP (TOPHAT_OPENMP: tophat_kernels): -fopenmp
  # defines _OPENMP, which GCC counts against a header precompiled without it. It takes those
  # targets' own options (OpenMP's flags among them). Its ten files parsed <ATen/ATen.h> each:
  # ~50 s a file in the aarch64 cross build on the CI machine.
  add_library(tophat_torch_pch_openmp OBJECT ${_source})
  set(_openmp_options)
  _tophat_targets_under(${PROJECT_SOURCE_DIR} _targets)
  foreach(_target IN LISTS _targets)
    get_target_property(_openmp ${_target} TOPHAT_OPENMP)
    if(_openmp)
      get_target_property(_options ${_target} COMPILE_OPTIONS)
      get_target_property(_libs ${_target} LINK_LIBRARIES)
      list(FILTER _libs INCLUDE REGEX "^OpenMP::")
      if(_options)
        list(APPEND _openmp_options ${_options})
      endif()
      target_link_libraries(tophat_torch_pch_openmp PRIVATE ${_libs})
    endif()
  endforeach()
  list(REMOVE_DUPLICATES _openmp_options)
  target_compile_options(tophat_torch_pch_openmp PRIVATE ${_openmp_options})
  foreach(_pch tophat_torch_pch_pic tophat_torch_pch_pie tophat_torch_pch_openmp)
    target_link_libraries(${_pch} PRIVATE torch)
    target_compile_options(${_pch} PRIVATE ${TORCH_CXX_FLAGS} -pthread)
    target_precompile_headers(${_pch} PRIVATE <ATen/ATen.h>)
  endforeach()
  set(_count 0)
  foreach(_target IN LISTS _targets)
    get_target_property(_type ${_target} TYPE)
    if(_target MATCHES "^tophat_torch_pch_" OR
       NOT _type MATCHES "^(EXECUTABLE|STATIC_LIBRARY|SHARED_LIBRARY|OBJECT_LIBRARY)$")
      continue()
    endif()
    _tophat_sees_torch(${_target} _sees)
    if(NOT _sees)
      continue()
    endif()
    get_target_property(_openmp ${_target} TOPHAT_OPENMP)
    if(_openmp)
      if(_type STREQUAL "EXECUTABLE")
        message(FATAL_ERROR "${_target}: TOPHAT_OPENMP's precompiled header is for libraries")
      endif()
      target_precompile_headers(${_target} REUSE_FROM tophat_torch_pch_openmp)
    elseif(_type STREQUAL "EXECUTABLE")
      target_precompile_headers(${_target} REUSE_FROM tophat_torch_pch_pie)
    else()
      target_precompile_headers(${_target} REUSE_FROM tophat_torch_pch_pic)
    endif()
    target_compile_options(${_target} PRIVATE "$<$<COMPILE_LANGUAGE:CXX>:-Winvalid-pch;-pthread>")
    math(EXPR _count "${_count} + 1")
  endforeach()
  message(STATUS "tophat: LibTorch headers precompiled for ${_count} targets")
endfunction()
