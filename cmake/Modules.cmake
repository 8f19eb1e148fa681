# Layering the build enforces (docs/architecture.md, "Layering").
#
# Includes are rooted at the project ("runner/spec/spec.h"), yet no target gets the source root as
# an include directory. Each module's headers are staged, as symlinks, under
#   ${CMAKE_BINARY_DIR}/include/<target>/<path from the source root>
# and that folder is the module's PUBLIC include directory. A target sees its own headers and those
# of what it links, nothing else: including a header of a module it does not link fails to compile
# with "<header>: No such file or directory". The links are the layering arrows; tests/layering/
# proves that a back-include fails.
#
# Symlinks rather than copies: an edited header needs no re-configure, and an editor or a compiler
# message that opens the staged path opens the real file.

# mltrain_stage_headers(<out_var> <stage> <glob>...)
# Links every header matching the globs (relative to the current source folder) into
# ${CMAKE_BINARY_DIR}/include/<stage>/, keeping its path from the source root, and sets <out_var>
# to that folder ("" when no header matches). A header added, moved or removed re-runs CMake (CONFIGURE_DEPENDS), and the stage
# is rebuilt from scratch so a deleted header does not stay reachable.
function(mltrain_stage_headers out_var stage)
  mltrain_stage_headers_from(dir ${stage} ${CMAKE_SOURCE_DIR} ${ARGN})
  set(${out_var} ${dir} PARENT_SCOPE)
endfunction()

# mltrain_stage_headers_from(<out_var> <stage> <root> <glob>...)
# As mltrain_stage_headers, keeping each header's path from <root> instead of the source root
# (comm includes its own headers from comm/src: "transport/link.h").
function(mltrain_stage_headers_from out_var stage root)
  set(globs ${ARGN})
  list(TRANSFORM globs PREPEND ${CMAKE_CURRENT_SOURCE_DIR}/)
  file(GLOB headers CONFIGURE_DEPENDS ${globs})
  set(dir ${CMAKE_BINARY_DIR}/include/${stage})
  file(REMOVE_RECURSE ${dir})
  if(NOT headers)
    set(${out_var} "" PARENT_SCOPE)
    return()
  endif()
  foreach(header ${headers})
    cmake_path(NORMAL_PATH header)
    file(RELATIVE_PATH rel ${root} ${header})
    get_filename_component(parent ${dir}/${rel} DIRECTORY)
    file(MAKE_DIRECTORY ${parent})
    file(CREATE_LINK ${header} ${dir}/${rel} SYMBOLIC)
  endforeach()
  set(${out_var} ${dir} PARENT_SCOPE)
endfunction()

# mltrain_module(<target> DIR <folder> SOURCES <file>...
#                [HEADERS <glob>...] [PUBLIC_DEPS <target>...] [PRIVATE_DEPS <target>...])
# One static library per folder. HEADERS (default <folder>/*.h) are its public headers, seen by
# whoever links it; <folder>/detail/*.h are seen by its own sources only. PUBLIC_DEPS are the
# layering arrows out of the module and nothing else; third-party libraries go in PRIVATE_DEPS
# unless a public header needs them.
function(mltrain_module name)
  cmake_parse_arguments(M "" "DIR" "SOURCES;HEADERS;PUBLIC_DEPS;PRIVATE_DEPS" ${ARGN})
  if(NOT M_DIR OR NOT M_SOURCES)
    message(FATAL_ERROR "mltrain_module(${name}): DIR and SOURCES are required")
  endif()
  if(NOT M_HEADERS)
    set(M_HEADERS ${M_DIR}/*.h)
  endif()
  mltrain_stage_headers(public_dir ${name} ${M_HEADERS})
  mltrain_stage_headers(detail_dir ${name}-detail ${M_DIR}/detail/*.h)
  add_library(${name} STATIC ${M_SOURCES})
  target_include_directories(${name} PUBLIC ${public_dir})
  if(detail_dir)
    target_include_directories(${name} PRIVATE ${detail_dir})
  endif()
  target_link_libraries(${name} PUBLIC ${M_PUBLIC_DEPS} PRIVATE mltrain_warnings ${M_PRIVATE_DEPS})
endfunction()
