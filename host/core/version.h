/* version.h - the release, in one place: both binaries' --version and core.version. */
#ifndef MN_VERSION_H
#define MN_VERSION_H

#define MN_VERSION "0.1.0"

#endif
