# Builds and runs one consumer project of tests/package/ (cmake -P script, run by ctest).
#
#   MODE=find_package      install the build tree CERTATTN_BINARY_DIR into a fresh prefix,
#                          check the package files and the version file, then configure the
#                          consumer with CMAKE_PREFIX_PATH=<prefix>
#   MODE=add_subdirectory  configure the consumer with CERTATTN_SOURCE_DIR=<checkout>
#
# Inputs (-D): MODE, CERTATTN_SOURCE_DIR, CERTATTN_BINARY_DIR, WORK_DIR, GENERATOR,
# MAKE_PROGRAM, CXX_COMPILER, BUILD_TYPE, CXX_FLAGS, EXE_LINKER_FLAGS, C_API (1 when the
# build has the C API's libraries: the find_package consumer then also builds and runs a C
# program against each). The compiler, build
# type and flags of the parent build are forwarded so the consumer is compiled the way the
# preset compiles everything else (-Werror in dev, sanitizers in sanitize).
cmake_minimum_required(VERSION 3.20)

foreach(var IN ITEMS MODE CERTATTN_SOURCE_DIR CERTATTN_BINARY_DIR WORK_DIR GENERATOR)
  if(NOT DEFINED ${var} OR "${${var}}" STREQUAL "")
    message(FATAL_ERROR "check_consumer.cmake: -D${var}=... is required")
  endif()
endforeach()

set(consumer_src ${CERTATTN_SOURCE_DIR}/tests/package/${MODE})
set(consumer_bin ${WORK_DIR}/build)
set(prefix ${WORK_DIR}/prefix)
file(REMOVE_RECURSE ${WORK_DIR})  # fresh every run: no stale install, no stale cache

set(consumer_args)
if(MODE STREQUAL "find_package")
  message(STATUS "installing ${CERTATTN_BINARY_DIR} into ${prefix}")
  execute_process(
    COMMAND ${CMAKE_COMMAND} --install ${CERTATTN_BINARY_DIR} --prefix ${prefix}
            --component certattn_Development
    COMMAND_ERROR_IS_FATAL ANY)
  foreach(f IN ITEMS include/certattn/certattn.hpp
                     include/certattn/c/certattn.h
                     share/certattn/cmake/certattnConfig.cmake
                     share/certattn/cmake/certattnConfigVersion.cmake
                     share/certattn/cmake/certattnTargets.cmake)
    if(NOT EXISTS ${prefix}/${f})
      message(FATAL_ERROR "install is missing ${f}")
    endif()
  endforeach()

  # The version file: SameMinorVersion and ARCH_INDEPENDENT (a header-only package must
  # load on any architecture, e.g. a 32-bit consumer).
  file(STRINGS ${prefix}/share/certattn/cmake/certattnConfigVersion.cmake version_line
       REGEX "^set\\(PACKAGE_VERSION \"")
  string(REGEX REPLACE ".*\"([0-9.]+)\".*" "\\1" installed_version "${version_line}")
  string(REGEX MATCH "^([0-9]+)\\.([0-9]+)" _ "${installed_version}")
  set(major ${CMAKE_MATCH_1})
  set(minor ${CMAKE_MATCH_2})
  math(EXPR next_minor "${minor} + 1")
  math(EXPR next_major "${major} + 1")
  function(expect_compatible requested sizeof_void_p expected)
    string(REPLACE "." ";" parts "${requested}")
    list(LENGTH parts count)
    list(GET parts 0 PACKAGE_FIND_VERSION_MAJOR)
    list(GET parts 1 PACKAGE_FIND_VERSION_MINOR)
    set(PACKAGE_FIND_VERSION_PATCH 0)
    if(count GREATER 2)
      list(GET parts 2 PACKAGE_FIND_VERSION_PATCH)
    endif()
    set(PACKAGE_FIND_VERSION ${requested})
    set(PACKAGE_FIND_VERSION_COUNT ${count})
    set(CMAKE_SIZEOF_VOID_P ${sizeof_void_p})
    set(PACKAGE_VERSION_COMPATIBLE)
    set(PACKAGE_VERSION_UNSUITABLE)
    include(${prefix}/share/certattn/cmake/certattnConfigVersion.cmake)
    if(PACKAGE_VERSION_UNSUITABLE)
      set(PACKAGE_VERSION_COMPATIBLE FALSE)
    endif()
    if(NOT "${PACKAGE_VERSION_COMPATIBLE}" STREQUAL "${expected}")
      message(FATAL_ERROR "version file: requesting ${requested} (sizeof(void*) = "
                          "${sizeof_void_p}) from ${installed_version} gives compatible = "
                          "'${PACKAGE_VERSION_COMPATIBLE}', expected ${expected}")
    endif()
  endfunction()
  expect_compatible(${major}.${minor} 8 TRUE)
  expect_compatible(${installed_version} 8 TRUE)
  expect_compatible(${major}.${minor} 4 TRUE)
  expect_compatible(${major}.${next_minor} 8 FALSE)
  expect_compatible(${next_major}.${minor} 8 FALSE)
  message(STATUS "version file of ${installed_version}: ok")

  list(APPEND consumer_args -DCMAKE_PREFIX_PATH=${prefix}
       -DCMAKE_FIND_PACKAGE_NO_PACKAGE_REGISTRY=ON)
  if(C_API)
    list(APPEND consumer_args -DCERTATTN_EXPECT_C_API=ON)
  endif()
elseif(MODE STREQUAL "add_subdirectory")
  list(APPEND consumer_args -DCERTATTN_SOURCE_DIR=${CERTATTN_SOURCE_DIR})
else()
  message(FATAL_ERROR "check_consumer.cmake: unknown MODE '${MODE}'")
endif()

if(MAKE_PROGRAM)
  list(APPEND consumer_args -DCMAKE_MAKE_PROGRAM=${MAKE_PROGRAM})
endif()
if(CXX_COMPILER)
  list(APPEND consumer_args -DCMAKE_CXX_COMPILER=${CXX_COMPILER})
endif()
if(BUILD_TYPE)
  list(APPEND consumer_args -DCMAKE_BUILD_TYPE=${BUILD_TYPE})
  string(TOUPPER "${BUILD_TYPE}" bt)
  # The per-configuration flags come from the parent too (the sanitize preset sets them).
  list(APPEND consumer_args "-DCMAKE_CXX_FLAGS_${bt}=${CXX_FLAGS_CONFIG}")
endif()
execute_process(
  COMMAND ${CMAKE_COMMAND} -S ${consumer_src} -B ${consumer_bin} -G ${GENERATOR}
          "-DCMAKE_CXX_FLAGS=${CXX_FLAGS}" "-DCMAKE_EXE_LINKER_FLAGS=${EXE_LINKER_FLAGS}"
          ${consumer_args}
  COMMAND_ERROR_IS_FATAL ANY)

if(MODE STREQUAL "find_package")
  # The package must come from the fresh prefix, not from anywhere else on the machine.
  file(STRINGS ${consumer_bin}/CMakeCache.txt found_dir REGEX "^certattn_DIR:")
  string(REGEX REPLACE "^certattn_DIR:[A-Z]+=" "" found_dir "${found_dir}")
  file(REAL_PATH "${found_dir}" found_dir)
  file(REAL_PATH "${prefix}" real_prefix)
  string(FIND "${found_dir}" "${real_prefix}/" at)
  if(NOT at EQUAL 0)
    message(FATAL_ERROR "find_package(certattn) found ${found_dir}, not the install in ${prefix}")
  endif()
endif()

execute_process(COMMAND ${CMAKE_COMMAND} --build ${consumer_bin} COMMAND_ERROR_IS_FATAL ANY)

set(exe ${consumer_bin}/consumer)
if(NOT EXISTS ${exe})
  # Multi-config generators put it in a per-configuration folder.
  file(GLOB_RECURSE exe ${consumer_bin}/*/consumer ${consumer_bin}/*/consumer.exe)
  list(GET exe 0 exe)
endif()
execute_process(COMMAND ${exe} RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "the ${MODE} consumer failed (exit ${rc})")
endif()
# The C ABI's consumers (find_package: the installed certattn_c, shared and static).
get_filename_component(exe_dir ${exe} DIRECTORY)
foreach(c_exe IN ITEMS consumer_c consumer_c_static)
  if(EXISTS ${exe_dir}/${c_exe})
    execute_process(COMMAND ${exe_dir}/${c_exe} RESULT_VARIABLE rc)
    if(NOT rc EQUAL 0)
      message(FATAL_ERROR "the ${MODE} ${c_exe} failed (exit ${rc})")
    endif()
  elseif(MODE STREQUAL "find_package" AND C_API)
    message(FATAL_ERROR "the ${MODE} consumer did not build ${c_exe}")
  endif()
endforeach()
message(STATUS "the ${MODE} consumer built against certattn and ran: ok")
