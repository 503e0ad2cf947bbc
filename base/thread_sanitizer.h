// Happens-before edges that ThreadSanitizer cannot see for itself. gRPC orders a callback
// reactor's reactions after the operations that started them (StartRead, then OnReadDone on
// another thread) through its own synchronization, inside libraries built without TSan: a
// TSan build sees a message the read filled on one thread and handled on the next as a race.
// TOPHAT_TSAN_RELEASE(p) before starting the operation and TOPHAT_TSAN_ACQUIRE(p) at the top
// of its reaction state that order to TSan, for that operation only (deploy/sanitize.sh
// --sanitizer thread). Without TSan they are nothing.
#pragma once

#if defined(__SANITIZE_THREAD__)
#define TOPHAT_THREAD_SANITIZER 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define TOPHAT_THREAD_SANITIZER 1
#endif
#endif

#if defined(TOPHAT_THREAD_SANITIZER)
extern "C" {
void __tsan_acquire(void* address);
void __tsan_release(void* address);
}
#define TOPHAT_TSAN_ACQUIRE(address) __tsan_acquire(static_cast<void*>(address))
#define TOPHAT_TSAN_RELEASE(address) __tsan_release(static_cast<void*>(address))
#else
#define TOPHAT_TSAN_ACQUIRE(address) static_cast<void>(0)
#define TOPHAT_TSAN_RELEASE(address) static_cast<void>(0)
#endif
