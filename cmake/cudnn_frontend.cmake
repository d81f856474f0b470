# NVIDIA's header-only cudnn-frontend (MIT), the C++ graph API that model/ops/cuda/attention_cudnn.cpp
# builds cuDNN's fused attention with. Its headers are taken from PyPI's nvidia-cudnn-frontend
# wheel (include/cudnn_frontend*.h), fetched at configure time with pip, pinned by version and
# checked by SHA-256; nothing of it is copied into the repository.
#
# rlhf_fetch_cudnn_frontend(<out var>): sets <out var> to the folder holding cudnn_frontend.h, or
# to "" (with a ✗ line saying why) when it cannot be had; never fails the configure.
#  - RLHF_CUDNN_FRONTEND_DIR (cache path): a folder with cudnn_frontend.h to use instead (offline
#    machines: e.g. the include/ of an unpacked wheel, or of a cudnn-frontend checkout).
#  - Otherwise the headers are unpacked once into <build>/_deps/cudnn_frontend-<version>/include
#    and reused by every later configure; a fresh build folder asks pip again (pip's own HTTP
#    cache usually answers without downloading).
#
# 1.18.0 is the release NVIDIA recommends for cuDNN 9.18.1 and later (1.19 asks for 9.19.1); it
# checks the cuDNN version at run time, so the same build runs against an older cuDNN 9 too. The
# wheel holds the same headers for every platform and Python version: one file (CPython 3.12,
# manylinux x86_64) is pinned and downloaded whatever the build machine is.
set(RLHF_CUDNN_FRONTEND_VERSION 1.18.0)
set(RLHF_CUDNN_FRONTEND_WHEEL
  nvidia_cudnn_frontend-1.18.0-cp312-cp312-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl)
set(RLHF_CUDNN_FRONTEND_SHA256
  6c023539ca6de99234cf5102c3ec0d6af817f5396fc93028a22ba5b834a35b8a)
set(RLHF_CUDNN_FRONTEND_DIR "" CACHE PATH
  "Folder holding cudnn_frontend.h (skips the pip download of nvidia-cudnn-frontend)")

function(rlhf_fetch_cudnn_frontend out_var)
  set(${out_var} "" PARENT_SCOPE)
  set(what "cudnn-frontend ${RLHF_CUDNN_FRONTEND_VERSION}")
  if(RLHF_CUDNN_FRONTEND_DIR)
    if(EXISTS "${RLHF_CUDNN_FRONTEND_DIR}/cudnn_frontend.h")
      set(${out_var} "${RLHF_CUDNN_FRONTEND_DIR}" PARENT_SCOPE)
    else()
      message(STATUS "✗ ${what}: RLHF_CUDNN_FRONTEND_DIR=${RLHF_CUDNN_FRONTEND_DIR} has no "
        "cudnn_frontend.h; building without cuDNN attention")
    endif()
    return()
  endif()

  set(root "${CMAKE_BINARY_DIR}/_deps/cudnn_frontend-${RLHF_CUDNN_FRONTEND_VERSION}")
  if(EXISTS "${root}/include/cudnn_frontend.h")
    set(${out_var} "${root}/include" PARENT_SCOPE)
    return()
  endif()

  find_package(Python3 QUIET COMPONENTS Interpreter)
  if(NOT Python3_Interpreter_FOUND)
    message(STATUS "✗ ${what}: no python3 to run pip (install python3-pip, or set "
      "RLHF_CUDNN_FRONTEND_DIR); building without cuDNN attention")
    return()
  endif()
  file(REMOVE_RECURSE "${root}")
  message(STATUS "Fetching ${what} headers with pip (nvidia-cudnn-frontend wheel)")
  execute_process(
    COMMAND ${CMAKE_COMMAND} -E env PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1
      ${Python3_EXECUTABLE} -m pip download --quiet --no-deps --only-binary=:all:
      --python-version 3.12 --platform manylinux_2_28_x86_64
      nvidia-cudnn-frontend==${RLHF_CUDNN_FRONTEND_VERSION} --dest "${root}/wheel"
    RESULT_VARIABLE rc OUTPUT_VARIABLE pip_out ERROR_VARIABLE pip_err TIMEOUT 180)
  set(wheel "${root}/wheel/${RLHF_CUDNN_FRONTEND_WHEEL}")
  if(NOT rc EQUAL 0 OR NOT EXISTS "${wheel}")
    # pip's ERROR line says enough (retries print WARNING lines first).
    string(REGEX MATCH "ERROR:[^\n]*" pip_error "${pip_err}")
    if(pip_error)
      set(pip_err "${pip_error}")
    endif()
    string(STRIP "${pip_err}" pip_err)
    message(STATUS "✗ ${what}: pip download failed (${rc}: ${pip_err}); building without cuDNN "
      "attention (set RLHF_CUDNN_FRONTEND_DIR to use headers already on this machine)")
    return()
  endif()
  file(SHA256 "${wheel}" sha)
  if(NOT sha STREQUAL RLHF_CUDNN_FRONTEND_SHA256)
    message(STATUS "✗ ${what}: ${RLHF_CUDNN_FRONTEND_WHEEL} has SHA-256 ${sha}, expected "
      "${RLHF_CUDNN_FRONTEND_SHA256}; building without cuDNN attention")
    file(REMOVE_RECURSE "${root}")
    return()
  endif()
  file(ARCHIVE_EXTRACT INPUT "${wheel}" DESTINATION "${root}/unpacked" PATTERNS "include/*")
  if(NOT EXISTS "${root}/unpacked/include/cudnn_frontend.h")
    message(STATUS "✗ ${what}: ${RLHF_CUDNN_FRONTEND_WHEEL} holds no include/cudnn_frontend.h; "
      "building without cuDNN attention")
    return()
  endif()
  # Moved into place last, so an interrupted fetch is never mistaken for a finished one.
  file(RENAME "${root}/unpacked/include" "${root}/include")
  file(REMOVE_RECURSE "${root}/unpacked" "${root}/wheel")
  set(${out_var} "${root}/include" PARENT_SCOPE)
endfunction()
