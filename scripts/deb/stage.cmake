# CPack's pre-build script (CPACK_PRE_BUILD_SCRIPTS): adds what a Debian package has and a
# plain `cmake --install` does not (the copyright, a compressed changelog, lintian's overrides)
# to the staged tree before the .deb is made from it.
set(root "${CPACK_TEMPORARY_INSTALL_DIRECTORY}${CPACK_PACKAGING_INSTALL_PREFIX}")
set(doc "${root}/share/doc/mmfeed")
file(COPY "${CPACK_MMFEED_DEB_DIR}/copyright" DESTINATION "${doc}")
# The changelog's date: $SOURCE_DATE_EPOCH's when set (scripts/package.sh sets the last commit's).
set(PROJECT_VERSION "${CPACK_PACKAGE_VERSION}")
set(MMFEED_MAINTAINER "${CPACK_PACKAGE_CONTACT}")
string(TIMESTAMP MMFEED_CHANGELOG_DATE "%a, %d %b %Y %H:%M:%S +0000" UTC)
configure_file("${CPACK_MMFEED_DEB_DIR}/changelog.in" "${CPACK_TOPLEVEL_DIRECTORY}/changelog" @ONLY)
execute_process(COMMAND gzip -9nc "${CPACK_TOPLEVEL_DIRECTORY}/changelog"
                OUTPUT_FILE "${doc}/changelog.gz" RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "gzip of the changelog failed")
endif()
file(MAKE_DIRECTORY "${root}/share/lintian/overrides")
configure_file("${CPACK_MMFEED_DEB_DIR}/lintian-overrides" "${root}/share/lintian/overrides/mmfeed" COPYONLY)
file(CHMOD "${doc}/copyright" "${doc}/changelog.gz" "${root}/share/lintian/overrides/mmfeed"
     PERMISSIONS OWNER_READ OWNER_WRITE GROUP_READ WORLD_READ)
# The package sets its files' modes itself, whatever the tree it was built from had (a `git
# archive` extracted with umask 002 makes 0664 files, which configure_file and install(DIRECTORY)
# carry over): folders 0755, executables 0755, every other file 0644.
foreach(args "-type;d;-exec;chmod;0755;{};+" "-type;f;-perm;/111;-exec;chmod;0755;{};+"
             "-type;f;!;-perm;/111;-exec;chmod;0644;{};+")
  execute_process(COMMAND find "${CPACK_TEMPORARY_INSTALL_DIRECTORY}" ${args} RESULT_VARIABLE rc)
  if(rc)
    message(FATAL_ERROR "setting the package's file modes failed")
  endif()
endforeach()
