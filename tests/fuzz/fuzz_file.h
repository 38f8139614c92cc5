/* tests/fuzz/fuzz_file.h — what the fuzz targets share: a private directory
 * (made once per process, removed at exit) where each input is written as the
 * file a parser opens by path, as the tools open them. */
#ifndef FSDP_FUZZ_FILE_H
#define FSDP_FUZZ_FILE_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char fuzz_dir[64];
static char fuzz_paths[4][128];
static int fuzz_n_paths;

static void fuzz_cleanup(void) {
  for (int i = 0; i < fuzz_n_paths; i++) unlink(fuzz_paths[i]);
  rmdir(fuzz_dir);
}

/* The directory, made on the first call. */
static const char *fuzz_dir_path(void) {
  if (!fuzz_dir[0]) {
    /* in memory where there is a tmpfs: a file is written per input */
    static const char *const bases[] = {"/dev/shm", "/tmp"};
    for (int i = 0; i < 2 && !fuzz_dir[0]; i++) {
      snprintf(fuzz_dir, sizeof fuzz_dir, "%s/fsdp-fuzz-XXXXXX", bases[i]);
      if (!mkdtemp(fuzz_dir)) fuzz_dir[0] = '\0';
    }
    if (!fuzz_dir[0]) abort();
    atexit(fuzz_cleanup);
  }
  return fuzz_dir;
}

/* Writes bytes (and then tail, which may be NULL) as the directory's `name`;
 * returns its path. */
static const char *fuzz_write(const char *name, const uint8_t *data, size_t size,
                              const char *tail) {
  char path[128];
  snprintf(path, sizeof path, "%s/%s", fuzz_dir_path(), name);
  FILE *f = fopen(path, "wb");
  if (!f || fwrite(data, 1, size, f) != size || (tail && fputs(tail, f) < 0) || fclose(f))
    abort();
  for (int i = 0; i < fuzz_n_paths; i++)
    if (!strcmp(fuzz_paths[i], path)) return fuzz_paths[i];
  if (fuzz_n_paths == 4) abort();
  snprintf(fuzz_paths[fuzz_n_paths], sizeof fuzz_paths[0], "%s", path);
  return fuzz_paths[fuzz_n_paths++];
}

/* Removes the directory's `name` if it was written. */
static void fuzz_remove(const char *name) {
  char path[128];
  snprintf(path, sizeof path, "%s/%s", fuzz_dir_path(), name);
  unlink(path);
}

#endif
