// SIGTERM/SIGINT handling for the daemons: block the signals in every thread before any is
// started, then collect them synchronously on the main thread, where shutting down is safe
// (no async-signal-safety constraints, no handler racing gRPC or the engine). SIGHUP
// (`systemctl reload`) is collected the same way and asks for a config reload.
#pragma once

#include <functional>

namespace tophat {

// Call first thing in main(), before any thread exists: threads inherit the mask.
void BlockShutdownSignals();

// Waits for SIGTERM or SIGINT and returns its name ("SIGTERM" or "SIGINT"). Each SIGHUP
// before it runs `on_reload` on this thread (none: SIGHUP is ignored, never fatal).
const char* WaitForShutdownSignal(const std::function<void()>& on_reload = {});

// Shuts the daemon down from within, from any thread: sends this process the SIGTERM that
// WaitForShutdownSignal returns (a lost pipeline stage or GPU).
void RequestShutdown();

}  // namespace tophat
