#include "telemetry/shutdown_signals.h"

#include <pthread.h>
#include <signal.h>
#include <unistd.h>

namespace tophat {
namespace {

sigset_t ShutdownSignals() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGHUP);
  return signals;
}

}  // namespace

void BlockShutdownSignals() {
  const sigset_t signals = ShutdownSignals();
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
}

const char* WaitForShutdownSignal(const std::function<void()>& on_reload) {
  const sigset_t signals = ShutdownSignals();
  while (true) {
    int signal_number = 0;
    if (sigwait(&signals, &signal_number) != 0) continue;
    if (signal_number == SIGHUP) {
      if (on_reload) on_reload();
      continue;
    }
    return signal_number == SIGTERM ? "SIGTERM" : "SIGINT";
  }
}

void RequestShutdown() { kill(getpid(), SIGTERM); }

}  // namespace tophat
