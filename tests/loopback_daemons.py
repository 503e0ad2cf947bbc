"""What the Python process tests share to run tophat-cloud and tophat-agent on loopback:
a free port, and the two daemons' configs over the bundles `tophat split` wrote to
WORK/bundles (plaintext links; metrics off unless a port is given)."""

import socket


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_configs(work, cloud_port, agent_port, max_context, kv_memory,
                  cloud_metrics=None, agent_metrics=None):
    """Writes WORK/cloud.yaml and WORK/agent.yaml; returns their paths."""
    def metrics(port):
        return '""' if port is None else f'"127.0.0.1:{port}"'
    cloud, agent = f"{work}/cloud.yaml", f"{work}/agent.yaml"
    with open(cloud, "w") as f:
        f.write(f'listen_address: "127.0.0.1:{cloud_port}"\nbundle: {work}/bundles/cloud\n'
                f'tls:\n  insecure: true\nmax_context: {max_context}\n'
                f'kv_cache:\n  memory_bytes: {kv_memory}\n'
                f'metrics_address: {metrics(cloud_metrics)}\n')
    with open(agent, "w") as f:
        f.write(f'listen_address: "127.0.0.1:{agent_port}"\n'
                f'cloud_address: "127.0.0.1:{cloud_port}"\nbundle: {work}/bundles/device\n'
                f'cloud_tls:\n  insecure: true\nmax_context: {max_context}\n'
                f'metrics_address: {metrics(agent_metrics)}\n')
    return cloud, agent
