# cmake -DLUA_DIR=<lua/> -DOUT=<header> -DSCRIPTS_OUT=<dir> -P EmbedLua.cmake
# Composes every lua/<name>.lua into the text Redis runs, writes that text to <dir>/<name>.lua
# (build/<preset>/lua/ in a preset build) and a header with each text as a string constant and
# its SHA1, which EVALSHA sends.
#
# One mechanism: a script may hold one line `-- include: a b ...` (at the start of a line, names in
# lowercase separated by spaces). The build keeps that line and puts lua/lib/a.lua, lua/lib/b.lua,
# ... right after it, in that order, each headed by `-- ==== lib/<name>.lua ====`, then
# `-- ==== <name>.lua, continued ====` and the rest of the script. Nothing else is added: a script
# without the line is sent as it is. lua/lib/ files are never scripts of their own and include
# nothing themselves, so a script names every file it uses, those used by another first
# (lib/base.lua before lib/redisson.lua or lib/onekey.lua).
# Where the line sits is where the helpers are made. Most scripts have it as their first line. A
# script with a fast path for its hot operation (acquire.lua, calendar_quota.lua) has it below that
# path: each `local function` of a library is a closure made on every call, so code above the line
# runs before any is made and uses none of them, and falls through to the full code below when
# anything is unusual. gcra.lua and fixed_window.lua share their fast path with batch.lua: it is a
# library (lib/gcra_fast.lua, lib/fixed_window_fast.lua) named first on their include line, which
# decides the script's own take before the libraries after it are made when the script set its
# flag (gcraFastCall, windowFastCall) above the line. A core library (lib/*_core.lua) makes
# its helpers only if the script set its flag (makesGcra, makesWindow, makesCalendar, makesLeases,
# makesRecords) above the line, so a script makes only the groups it uses (multi.lua: the kinds in
# the call).
# Line numbers: an error's `user_script:LINE` (Redis names every script so) is a line of the text
# in <dir>/<name>.lua, exactly the text whose SHA1 is sent. Up to the include line it is also the
# line of lua/<name>.lua; below it, the `-- ====` headers say which file a line comes from.
cmake_minimum_required(VERSION 3.25)
foreach(var LUA_DIR OUT SCRIPTS_OUT)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "EmbedLua.cmake needs -D${var}=...")
  endif()
endforeach()

# write_if_changed(<path> <text>): a file whose text is already that keeps its time stamp.
function(write_if_changed path text)
  if(EXISTS "${path}")
    file(READ "${path}" old)
    if(old STREQUAL text)
      return()
    endif()
  endif()
  file(WRITE "${path}" "${text}")
endfunction()

# compose(<script path> <name> <out var>): the text Redis runs for lua/<name>.lua.
function(compose path name out)
  file(READ "${path}" text)
  set(padded "\n${text}")  # every line, the first one too, starts after a newline
  if(padded MATCHES "\n-- (@shared|include-first)")
    message(FATAL_ERROR "${path}: '-- ${CMAKE_MATCH_1}' is gone; the one way to put libraries in is a line "
                        "'-- include: name ...' where they go (see cmake/EmbedLua.cmake)")
  endif()
  # Every line that starts with "-- include" must be the one include line.
  string(REGEX MATCHALL "\n-- include[^\n]*" lines "${padded}")
  list(LENGTH lines count)
  if(count EQUAL 0)
    set(${out} "${text}" PARENT_SCOPE)
    return()
  endif()
  if(count GREATER 1)
    message(FATAL_ERROR "${path}: more than one '-- include' line; name every library on one line")
  endif()
  if(NOT padded MATCHES "\n(-- include:([ a-z0-9_]*)\n)")
    message(FATAL_ERROR "${path}: the include line must be '-- include: name ...' (lowercase names, spaces)")
  endif()
  set(line "${CMAKE_MATCH_1}")
  string(STRIP "${CMAKE_MATCH_2}" names)
  if(names STREQUAL "")
    message(FATAL_ERROR "${path}: '-- include:' names no file")
  endif()
  string(FIND "${padded}" "\n${line}" at)  # at + 1 in padded is at in text: after = at + length
  string(LENGTH "${line}" lineLength)
  math(EXPR after "${at} + ${lineLength}")
  string(SUBSTRING "${text}" 0 ${after} result)
  string(SUBSTRING "${text}" ${after} -1 rest)
  string(REGEX REPLACE " +" ";" names "${names}")
  set(seen "")
  foreach(lib IN LISTS names)
    if(lib IN_LIST seen)
      message(FATAL_ERROR "${path} includes ${lib} twice")
    endif()
    list(APPEND seen "${lib}")
    set(libPath "${LUA_DIR}/lib/${lib}.lua")
    if(NOT EXISTS "${libPath}")
      message(FATAL_ERROR "${path} includes ${lib}, but ${libPath} does not exist")
    endif()
    file(READ "${libPath}" libText)
    if("\n${libText}" MATCHES "\n-- (include|@shared)")
      message(FATAL_ERROR "${libPath}: a library includes nothing; the script names every file it uses")
    endif()
    if(NOT libText MATCHES "\n$")
      string(APPEND libText "\n")
    endif()
    string(APPEND result "-- ==== lib/${lib}.lua ====\n${libText}")
  endforeach()
  string(APPEND result "-- ==== ${name}.lua, continued ====\n${rest}")
  set(${out} "${result}" PARENT_SCOPE)
endfunction()

file(GLOB scripts "${LUA_DIR}/*.lua")
list(SORT scripts)
file(MAKE_DIRECTORY "${SCRIPTS_OUT}")
set(body "")
set(all "")
set(written "")
foreach(path IN LISTS scripts)
  get_filename_component(name "${path}" NAME_WE)
  compose("${path}" "${name}" text)
  string(SHA1 sha "${text}")
  string(FIND "${text}" ")redlimit_lua\"" clash)
  if(NOT clash EQUAL -1)
    message(FATAL_ERROR "${path} contains the raw-string delimiter")
  endif()
  write_if_changed("${SCRIPTS_OUT}/${name}.lua" "${text}")
  list(APPEND written "${SCRIPTS_OUT}/${name}.lua")
  string(APPEND body "inline constexpr EmbeddedScript ${name}{\"${name}\", \"${sha}\", R\"redlimit_lua(${text})redlimit_lua\"};\n")
  string(APPEND all "    &${name},\n")
endforeach()
# A script that was removed from lua/ leaves no composed text behind.
file(GLOB stale "${SCRIPTS_OUT}/*.lua")
foreach(path IN LISTS stale)
  if(NOT path IN_LIST written)
    file(REMOVE "${path}")
  endif()
endforeach()
set(content "// Generated by cmake/EmbedLua.cmake from lua/*.lua. Do not edit.\n#pragma once\n\n// A script with its libraries may be over the 65 536 characters C++ guarantees for a string\n// literal (multi.lua is): g++ and clang++ take it; -Wpedantic would say so.\n#pragma GCC diagnostic push\n#pragma GCC diagnostic ignored \"-Woverlength-strings\"\n\nnamespace redlimit::detail::lua {\n\nstruct EmbeddedScript {\n  const char* name;\n  const char* sha1;\n  const char* source;\n};\n\n${body}\n// Every script above, in the order of their names.\ninline constexpr const EmbeddedScript* kAll[] = {\n${all}};\n\n}  // namespace redlimit::detail::lua\n\n#pragma GCC diagnostic pop\n")
write_if_changed("${OUT}" "${content}")
