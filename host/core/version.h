/* version.h - the one version of monarch (binaries, core.version, monarch-kernel.pc). */
#ifndef MN_VERSION_H
#define MN_VERSION_H

#define MN_VERSION "0.1.0"

#endif
