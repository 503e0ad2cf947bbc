// Gives the heap's free memory back to the operating system.
#pragma once

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace tophat {

// glibc keeps what a process frees for its own reuse, in every thread's arena, so memory a
// burst took (a stream that stopped reading, with its queued results and unread chunks) stays
// in the resident set after the burst is over. malloc_trim returns the free pages of every
// arena, not only the top of the main heap. It takes about a millisecond per GiB of heap:
// call it when a burst ends (a stream goes), not per request.
inline void ReleaseFreedMemory() {
#if defined(__GLIBC__)
  malloc_trim(0);
#endif
}

}  // namespace tophat
