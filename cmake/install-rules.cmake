# install() + export of the header-only target (and of the C ABI's libraries when
# CERTATTN_BUILD_C_API is on), a relocatable certattnConfig.cmake that finds
# xsimd again, and a version file. Everything is in one component, so
# `cmake --install <build> --component certattn_Development` installs the library alone
# whatever else (bench, examples) the build tree holds.
include(CMakePackageConfigHelpers)

set(CERTATTN_CMAKE_DIR ${CMAKE_INSTALL_DATADIR}/certattn/cmake
    CACHE STRING "Where certattnConfig.cmake is installed, relative to the prefix")
mark_as_advanced(CERTATTN_CMAKE_DIR)

install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
        COMPONENT certattn_Development)
# An INTERFACE library installs no file itself; this only puts it in the export set.
install(TARGETS certattn EXPORT certattnTargets)
# The C ABI (CERTATTN_BUILD_C_API): certattn::certattn_c (shared) and certattn_c_static.
if(TARGET certattn_c)
  install(TARGETS certattn_c certattn_c_static EXPORT certattnTargets
          RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT certattn_Development
          LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT certattn_Development
          ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT certattn_Development)
endif()
install(EXPORT certattnTargets
        NAMESPACE certattn::
        DESTINATION ${CERTATTN_CMAKE_DIR}
        COMPONENT certattn_Development)

configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/certattnConfig.cmake.in
  ${PROJECT_BINARY_DIR}/certattnConfig.cmake
  INSTALL_DESTINATION ${CERTATTN_CMAKE_DIR})
# Header-only: the version file must not pin the architecture of the build machine (the
# optional C ABI libraries are built for it; a consumer of another architecture can still
# use the headers).
# SameMinorVersion: 0.x releases may break the API between minors.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/certattnConfigVersion.cmake
  COMPATIBILITY SameMinorVersion ARCH_INDEPENDENT)
install(FILES ${PROJECT_BINARY_DIR}/certattnConfig.cmake
              ${PROJECT_BINARY_DIR}/certattnConfigVersion.cmake
              ${PROJECT_SOURCE_DIR}/cmake/certattn-xsimd-xtl.cmake
        DESTINATION ${CERTATTN_CMAKE_DIR}
        COMPONENT certattn_Development)
