// Gives the heap's free memory back to the operating system.
#pragma once

#if defined(__GLIBC__)
#include <malloc.h>
#endif

// Under a sanitizer the heap is the sanitizer's, not glibc's: malloc_trim would find glibc's
// allocator never initialized, and two threads that call it first at once race in its lazy
// initialization (one sees it flagged ready and walks empty bins: a SEGV reading address 8,
// seen in the sanitized serving run when a stream's engine detach and its reactor's end both
// released memory). There is nothing of glibc's to give back then.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define TOPHAT_HEAP_IS_SANITIZERS 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) || \
    __has_feature(memory_sanitizer)
#define TOPHAT_HEAP_IS_SANITIZERS 1
#endif
#endif

namespace tophat {

// glibc keeps what a process frees for its own reuse, in every thread's arena, so memory a
// burst took (a stream that stopped reading, with its queued results and unread chunks) stays
// in the resident set after the burst is over. malloc_trim returns the free pages of every
// arena, not only the top of the main heap. It takes about a millisecond per GiB of heap:
// call it when a burst ends (a stream goes), not per request.
inline void ReleaseFreedMemory() {
#if defined(__GLIBC__) && !defined(TOPHAT_HEAP_IS_SANITIZERS)
  malloc_trim(0);
#endif
}

}  // namespace tophat
