# Finds hiredis through pkg-config and defines the imported target redlimit::hiredis.
# Debian 12's libhiredis-dev ships CMake files that point at missing paths, so we do not use them.
# Sets RedlimitHiredis_FOUND and RedlimitHiredis_VERSION.
include(FindPackageHandleStandardArgs)
find_package(PkgConfig QUIET)
if(PkgConfig_FOUND)
  pkg_check_modules(PC_HIREDIS QUIET hiredis)
endif()
find_path(RedlimitHiredis_INCLUDE_DIR NAMES hiredis/hiredis.h HINTS ${PC_HIREDIS_INCLUDEDIR} ${PC_HIREDIS_INCLUDE_DIRS})
find_library(RedlimitHiredis_LIBRARY NAMES hiredis HINTS ${PC_HIREDIS_LIBDIR} ${PC_HIREDIS_LIBRARY_DIRS})
set(RedlimitHiredis_VERSION "${PC_HIREDIS_VERSION}")
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
