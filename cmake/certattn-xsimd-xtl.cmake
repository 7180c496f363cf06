# Debian bookworm's libxsimd-dev (8.1.0-7) exports the target `xsimd` with
# INTERFACE_LINK_LIBRARIES "xtl", but neither depends on libxtl-dev nor finds xtl in
# xsimdConfig.cmake: every target linking `xsimd` then gets `-lxtl` and fails to link
# ("cannot find -lxtl"); bookworm has no libxtl-dev package that would provide it, and
# xsimd's installed config offers no switch to leave it out. xsimd uses xtl only when
# XSIMD_ENABLE_XTL_COMPLEX is defined, which neither certattn (arch/portable.hpp) nor the
# package does, so when no `xtl` target is known we drop the dangling name. Included after find_package(xsimd) by CMakeLists.txt and by the
# installed certattnConfig.cmake; a project that wants xtl finds it before certattn.
if(TARGET xsimd AND NOT TARGET xtl)
  get_target_property(_certattn_xsimd_links xsimd INTERFACE_LINK_LIBRARIES)
  if(_certattn_xsimd_links)
    list(REMOVE_ITEM _certattn_xsimd_links xtl)
    set_target_properties(xsimd PROPERTIES INTERFACE_LINK_LIBRARIES "${_certattn_xsimd_links}")
  endif()
  unset(_certattn_xsimd_links)
endif()
