/* fake-gpus.conf: what the fake GPU libraries pretend this host has (tests/fakes/README.md).
 * The file lies in the folder of the fake library that reads it. Lines are "HOST KEY VALUE...",
 * HOST a host name as gethostname() gives it or "*"; '#' starts a comment. For each key the last
 * line whose HOST matches this host wins. */
#ifndef MLTRAIN_FAKE_CONF_H
#define MLTRAIN_FAKE_CONF_H

#include <stddef.h>

/* The value of `key` for this host, or NULL. `self` is any function of the calling library, to
 * find its folder. The returned string lives until the process ends. */
const char* fake_conf_get(const void* self, const char* key);
long fake_conf_int(const void* self, const char* key, long fallback);
/* This host's name, and a stable 32-bit hash of it (FNV-1a) for UUIDs. */
const char* fake_host_name(void);
unsigned fake_host_hash(void);
/* Physical GPU i of this host: "GPU-hhhhhhhh-0000-4000-8000-iiiiiiiiiiii" (h: host hash). */
void fake_gpu_uuid(int i, char* out, size_t len);

#endif
