# Feature gates, in one generated header (build/generated/config.h).
set(MLTRAIN_CUDA_ROOT "/usr/local/cuda" CACHE PATH "Where CUDA and NCCL headers live")
if(EXISTS "${MLTRAIN_CUDA_ROOT}/include/nccl.h")
  set(MLTRAIN_HAVE_NCCL_HEADERS 1)
  set(MLTRAIN_NCCL_INCLUDE_DIR "${MLTRAIN_CUDA_ROOT}/include")
else()
  set(MLTRAIN_HAVE_NCCL_HEADERS 0)
endif()
execute_process(COMMAND git -C "${CMAKE_SOURCE_DIR}" rev-parse --short HEAD
  OUTPUT_VARIABLE MLTRAIN_GIT_COMMIT OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
if(NOT MLTRAIN_GIT_COMMIT)
  set(MLTRAIN_GIT_COMMIT "unknown")
endif()
configure_file(${CMAKE_SOURCE_DIR}/cmake/config.h.in ${CMAKE_BINARY_DIR}/generated/config.h @ONLY)

# mltrain_embed_text(OUTPUT out.cpp NAMESPACE ns FILES a b ...)
function(mltrain_embed_text)
  cmake_parse_arguments(E "" "OUTPUT;NAMESPACE" "FILES" ${ARGN})
  string(REPLACE ";" "\\;" files_arg "${E_FILES}")
  add_custom_command(OUTPUT ${E_OUTPUT}
    COMMAND ${CMAKE_COMMAND} -DOUT=${E_OUTPUT} -DNAMESPACE=${E_NAMESPACE} "-DFILES=${files_arg}"
            -P ${CMAKE_SOURCE_DIR}/cmake/EmbedText.cmake
    DEPENDS ${E_FILES} ${CMAKE_SOURCE_DIR}/cmake/EmbedText.cmake
    COMMENT "Embedding ${E_NAMESPACE}")
endfunction()

# config.h for whoever needs a feature gate or the version: link mltrain_config.
add_library(mltrain_config INTERFACE)
target_include_directories(mltrain_config INTERFACE ${CMAKE_BINARY_DIR}/generated)
