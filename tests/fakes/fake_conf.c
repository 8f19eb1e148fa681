/* Reads fake-gpus.conf beside the calling library (see fake_conf.h). */
#define _GNU_SOURCE
#include "fake_conf.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

const char* fake_host_name(void) {
  static char name[256];
  if (name[0] == 0 && gethostname(name, sizeof name - 1) != 0) strcpy(name, "localhost");
  return name;
}

unsigned fake_host_hash(void) {
  unsigned h = 2166136261u;
  for (const char* p = fake_host_name(); *p; ++p) h = (h ^ (unsigned char)*p) * 16777619u;
  return h;
}

void fake_gpu_uuid(int i, char* out, size_t len) {
  snprintf(out, len, "GPU-%08x-0000-4000-8000-%012x", fake_host_hash(), (unsigned)i);
}

/* Every value handed out, once each: callers keep them for the process's life, and a leak checker
 * sees them reachable from here (the fakes run under LeakSanitizer in the ASan unit tier). */
static const char* interned(const char* v) {
  static char** kept = NULL;
  static size_t n = 0, cap = 0;
  for (size_t i = 0; i < n; ++i)
    if (strcmp(kept[i], v) == 0) return kept[i];
  if (n == cap) {
    size_t bigger = cap ? cap * 2 : 64;
    char** grown = realloc(kept, bigger * sizeof *kept);
    if (grown == NULL) return NULL;
    kept = grown, cap = bigger;
  }
  kept[n] = strdup(v);
  return kept[n] ? kept[n++] : NULL;
}

const char* fake_conf_get(const void* self, const char* key) {
  Dl_info info;
  if (dladdr(self, &info) == 0 || info.dli_fname == NULL) return NULL;
  char path[4096];
  snprintf(path, sizeof path, "%s", info.dli_fname);
  char* slash = strrchr(path, '/');
  if (slash == NULL)
    snprintf(path, sizeof path, "fake-gpus.conf");
  else
    snprintf(slash + 1, sizeof path - (size_t)(slash + 1 - path), "fake-gpus.conf");
  FILE* f = fopen(path, "r");
  if (f == NULL) return NULL;
  char line[1024];
  char* found = NULL;
  const char* host = fake_host_name();
  while (fgets(line, sizeof line, f)) {
    char* hash = strchr(line, '#');
    if (hash) *hash = 0;
    line[strcspn(line, "\r\n")] = 0;
    char* save = NULL;
    char* h = strtok_r(line, " \t", &save);
    char* k = h ? strtok_r(NULL, " \t", &save) : NULL;
    if (k == NULL || strcmp(k, key) != 0) continue;
    if (strcmp(h, "*") != 0 && strcmp(h, host) != 0) continue;
    char* v = save ? save : (char*)"";
    while (*v == ' ' || *v == '\t') ++v;
    size_t n = strlen(v);
    while (n > 0 && (v[n - 1] == ' ' || v[n - 1] == '\t')) v[--n] = 0;
    free(found);
    found = strdup(v);
  }
  fclose(f);
  const char* value = found ? interned(found) : NULL;
  free(found);
  return value;
}

long fake_conf_int(const void* self, const char* key, long fallback) {
  const char* v = fake_conf_get(self, key);
  if (v == NULL || *v == 0) return fallback;
  char* end = NULL;
  long n = strtol(v, &end, 10);
  return end && *end == 0 ? n : fallback;
}
