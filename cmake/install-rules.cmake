include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

install(DIRECTORY include/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(TARGETS certattn EXPORT certattnTargets)
set(CERTATTN_CMAKE_DIR ${CMAKE_INSTALL_DATADIR}/certattn/cmake)
install(EXPORT certattnTargets NAMESPACE certattn:: DESTINATION ${CERTATTN_CMAKE_DIR})
configure_package_config_file(cmake/certattnConfig.cmake.in
  ${PROJECT_BINARY_DIR}/certattnConfig.cmake INSTALL_DESTINATION ${CERTATTN_CMAKE_DIR})
# Header-only: the version file must not pin the architecture of the build machine.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/certattnConfigVersion.cmake
  COMPATIBILITY SameMinorVersion ARCH_INDEPENDENT)
install(FILES ${PROJECT_BINARY_DIR}/certattnConfig.cmake
              ${PROJECT_BINARY_DIR}/certattnConfigVersion.cmake
        DESTINATION ${CERTATTN_CMAKE_DIR})
