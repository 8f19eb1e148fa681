# Every dependency comes from Debian's packages (scripts/setup.sh installs them).
find_package(Threads REQUIRED)
find_package(CLI11 CONFIG REQUIRED)
find_package(tomlplusplus CONFIG REQUIRED)
find_package(nlohmann_json CONFIG REQUIRED)
find_package(fmt CONFIG REQUIRED)
find_package(spdlog CONFIG REQUIRED)
find_package(libssh CONFIG REQUIRED)
find_package(PkgConfig REQUIRED)
pkg_check_modules(RE2 REQUIRED IMPORTED_TARGET re2)
# Sync: zstd compresses what travels (the agent links the static library: glibc is its only
# shared library); XXH3 hashes file contents (xxhash.h inline, no library).
find_path(XXHASH_INCLUDE_DIR xxhash.h REQUIRED)
find_library(ZSTD_LIBRARY NAMES zstd REQUIRED)
find_library(ZSTD_STATIC_LIBRARY NAMES libzstd.a REQUIRED)
find_path(ZSTD_INCLUDE_DIR zstd.h REQUIRED)
if(MLTRAIN_BUILD_TESTS)
  find_package(doctest CONFIG REQUIRED)
endif()
