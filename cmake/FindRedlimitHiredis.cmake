# Finds hiredis through pkg-config and defines the imported target redlimit::hiredis.
# Debian 12's libhiredis-dev ships CMake files that point at missing paths, so we do not use them.
# Sets RedlimitHiredis_FOUND and RedlimitHiredis_VERSION (from hiredis.h: the header compiled
# against, whatever pkg-config says).
#
# Another hiredis than the system's (docs/layout.md): -DCMAKE_PREFIX_PATH=<prefix> (or
# -DRedlimitHiredis_ROOT=<prefix>), where <prefix> holds include/hiredis/hiredis.h and
# lib/libhiredis.so, as hiredis's `make PREFIX=<prefix> install` lays them out. The prefix is
# searched before pkg-config's answer and the system's directories (and pkg-config looks in
# <prefix>/lib/pkgconfig first). scripts/ci-hiredis12.sh builds this way against hiredis 1.2.0.
include(FindPackageHandleStandardArgs)
find_package(PkgConfig QUIET)
if(PkgConfig_FOUND)
  pkg_check_modules(PC_HIREDIS QUIET hiredis)
endif()
find_path(RedlimitHiredis_INCLUDE_DIR NAMES hiredis/hiredis.h HINTS ${PC_HIREDIS_INCLUDEDIR} ${PC_HIREDIS_INCLUDE_DIRS})
find_library(RedlimitHiredis_LIBRARY NAMES hiredis HINTS ${PC_HIREDIS_LIBDIR} ${PC_HIREDIS_LIBRARY_DIRS})
set(RedlimitHiredis_VERSION "")
if(RedlimitHiredis_INCLUDE_DIR AND EXISTS "${RedlimitHiredis_INCLUDE_DIR}/hiredis/hiredis.h")
  file(STRINGS "${RedlimitHiredis_INCLUDE_DIR}/hiredis/hiredis.h" _redlimit_hiredis_version_lines
       REGEX "^#define HIREDIS_(MAJOR|MINOR|PATCH) [0-9]+")
  foreach(_part MAJOR MINOR PATCH)
    string(REGEX REPLACE ".*#define HIREDIS_${_part} ([0-9]+).*" "\\1" _redlimit_hiredis_${_part}
           "${_redlimit_hiredis_version_lines}")
  endforeach()
  set(RedlimitHiredis_VERSION "${_redlimit_hiredis_MAJOR}.${_redlimit_hiredis_MINOR}.${_redlimit_hiredis_PATCH}")
  unset(_redlimit_hiredis_version_lines)
endif()
find_package_handle_standard_args(RedlimitHiredis
  REQUIRED_VARS RedlimitHiredis_LIBRARY RedlimitHiredis_INCLUDE_DIR
  VERSION_VAR RedlimitHiredis_VERSION)
if(RedlimitHiredis_FOUND AND NOT TARGET redlimit::hiredis)
  add_library(redlimit::hiredis UNKNOWN IMPORTED)
  set_target_properties(redlimit::hiredis PROPERTIES
    IMPORTED_LOCATION "${RedlimitHiredis_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${RedlimitHiredis_INCLUDE_DIR}")
endif()
mark_as_advanced(RedlimitHiredis_INCLUDE_DIR RedlimitHiredis_LIBRARY)
