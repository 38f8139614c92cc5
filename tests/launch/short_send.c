/* tests/launch/short_send.c — an LD_PRELOAD shim for nodes-short-send:
 * send(2) takes at most 3 bytes a call, and every other call fails with
 * EAGAIN, as a socket whose send buffer is nearly full does; a sender that
 * does not finish its lines itself loses the rest of them. */
#include <dlfcn.h>
#include <errno.h>
#include <sys/socket.h>

__attribute__((visibility("default"))) ssize_t send(int fd, const void *buf, size_t len,
                                                   int flags) {
  static ssize_t (*real)(int, const void *, size_t, int);
  static int calls;
  if (!real) real = (ssize_t(*)(int, const void *, size_t, int))dlsym(RTLD_NEXT, "send");
  if (calls++ % 2) return errno = EAGAIN, -1;
  return real(fd, buf, len < 3 ? len : 3, flags);
}
