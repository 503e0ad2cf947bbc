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
  return signals;
}

}  // namespace

void BlockShutdownSignals() {
  const sigset_t signals = ShutdownSignals();
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
}

const char* WaitForShutdownSignal() {
  const sigset_t signals = ShutdownSignals();
  int signal_number = 0;
  sigwait(&signals, &signal_number);
  return signal_number == SIGTERM ? "SIGTERM" : "SIGINT";
}

void RequestShutdown() { kill(getpid(), SIGTERM); }

}  // namespace tophat
