"""systemd's side of the notification protocol, for tests/systemd_test.sh.

Usage: python3 systemd_notify.py BIN_DIR WORK_DIR (WORK_DIR/bundles from `tophat split`).
Binds a datagram socket, starts tophat-cloud and then tophat-agent with NOTIFY_SOCKET set
(and WATCHDOG_USEC for the cloud), and checks what each sends: READY=1 only once its port
listens, WATCHDOG=1 at least every watchdog interval, RELOADING=1 and then READY=1 on SIGHUP
(`systemctl reload`, ExecReload=), STOPPING=1 on SIGTERM, exit status 0.
"""

import os
import signal
import socket
import subprocess
import sys
import time

from loopback_daemons import free_port, write_configs

WATCHDOG_USEC = 600_000  # systemd would expect a ping within 0.6 s


def listening(port):
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


class Notifications:
    def __init__(self, path):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(path)
        self.path = path

    def next(self, seconds):
        """The next message, or None after `seconds`."""
        self.sock.settimeout(seconds)
        try:
            return self.sock.recv(4096).decode()
        except socket.timeout:
            return None

    def wait_for(self, key, seconds, what):
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            message = self.next(max(0.01, deadline - time.monotonic()))
            if message is not None and key in message.split("\n"):
                return message
        raise SystemExit(f"FAIL: {what}: no {key} within {seconds} s")


def start(binary, config, notify, log, watchdog):
    env = dict(os.environ, NOTIFY_SOCKET=notify)
    env.pop("WATCHDOG_USEC", None)
    env.pop("WATCHDOG_PID", None)
    if watchdog:
        env["WATCHDOG_USEC"] = str(WATCHDOG_USEC)
    return subprocess.Popen([binary, "--config", config], env=env,
                            stdout=open(log, "w"), stderr=subprocess.STDOUT)


def reload(name, process, events):
    """SIGHUP: RELOADING=1, then READY=1 once the reload is done, and the daemon serves on."""
    process.send_signal(signal.SIGHUP)
    events.wait_for("RELOADING=1", 30, f"{name} on SIGHUP")
    events.wait_for("READY=1", 30, f"{name} after its reload")
    if process.poll() is not None:
        raise SystemExit(f"FAIL: {name} exited {process.returncode} on SIGHUP")
    print(f"{name}: RELOADING=1, then READY=1 on SIGHUP, still running")


def stop(name, process, events):
    """SIGTERM: STOPPING=1 first, then exit status 0."""
    process.send_signal(signal.SIGTERM)
    events.wait_for("STOPPING=1", 30, f"{name} on SIGTERM")
    if process.wait(timeout=60) != 0:
        raise SystemExit(f"FAIL: {name} exited {process.returncode}")
    print(f"{name}: STOPPING=1 on SIGTERM, exit 0")


def main():
    bin_dir, work = sys.argv[1], sys.argv[2]
    cloud_port, agent_port = free_port(), free_port()
    cloud_config, agent_config = write_configs(work, cloud_port, agent_port, max_context=512,
                                               kv_memory="32MiB")

    cloud_events = Notifications(f"{work}/cloud.notify")
    cloud = start(f"{bin_dir}/tophat-cloud", cloud_config, cloud_events.path,
                  f"{work}/cloud.log", watchdog=True)
    try:
        ready = cloud_events.wait_for("READY=1", 120, "tophat-cloud")
        if not listening(cloud_port):
            raise SystemExit("FAIL: tophat-cloud said READY=1 before its port listened")
        print(f"tophat-cloud: {ready!r} with its port listening")
        # Pings keep coming: the daemon sends one every quarter interval (0.15 s) while the
        # engine loop turns (every 50 ms when idle); 1.2 s without one leaves 8x slack for a
        # loaded machine's scheduling, and still fails a daemon that stopped pinging.
        for _ in range(8):
            cloud_events.wait_for("WATCHDOG=1", 2 * WATCHDOG_USEC / 1e6,
                                  "tophat-cloud's watchdog")
        print("tophat-cloud: WATCHDOG=1 kept coming, 8 in a row each within 1.2 s")

        agent_events = Notifications(f"{work}/agent.notify")
        agent = start(f"{bin_dir}/tophat-agent", agent_config, agent_events.path,
                      f"{work}/agent.log", watchdog=False)
        try:
            agent_events.wait_for("READY=1", 120, "tophat-agent")
            if not listening(agent_port):
                raise SystemExit("FAIL: tophat-agent said READY=1 before its port listened")
            print("tophat-agent: READY=1 with its port listening")
            reload("tophat-agent", agent, agent_events)
            stop("tophat-agent", agent, agent_events)
        finally:
            if agent.poll() is None:
                agent.kill()

        reload("tophat-cloud", cloud, cloud_events)
        stop("tophat-cloud", cloud, cloud_events)
    finally:
        if cloud.poll() is None:
            cloud.kill()
    print("PASS")


if __name__ == "__main__":
    main()
