#!/usr/bin/env python3
"""Checks that the project's dependency arrows point one way (docs/architecture.md, "Layout").

    python3 tests/layout_check.py [SOURCE_DIR]

Every room (a folder with one library or program) may include headers of the rooms listed
before it, never of those after it. Exits 1 and names each back edge (file, line, header).
"""
import os
import re
import sys

# Bottom first. A room may depend only on rooms above it in this list.
ROOMS = [
    "base",
    "kernels",
    "models/formats",
    "models/tokenizers",
    "models/grammar",
    "models/runtime",
    "models/training",
    "scheduler",
    "configs",
    "telemetry",
    "proto",
    "sdk",
    "server/pipeline",
    "server",
    "device_agent",
    "fuzz",
    "bench",
    "sim",
    "cli",
    "tests",
]
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def room_of(path):
    for room in sorted(ROOMS, key=len, reverse=True):
        if path.startswith(room + "/"):
            return room
    if path.startswith("tophat/v1/"):  # generated from proto/
        return "proto"
    return None


def back_edges(source_dir):
    rank = {room: i for i, room in enumerate(ROOMS)}
    found = []
    for room in ROOMS:
        for root, _, files in os.walk(os.path.join(source_dir, room)):
            for name in sorted(files):
                if not name.endswith((".h", ".cc", ".cu", ".cuh")):
                    continue
                path = os.path.join(root, name)
                rel = os.path.relpath(path, source_dir)
                if room_of(rel) != room:
                    continue  # a nested room reports its own files
                text = open(path, encoding="utf-8", errors="replace").read()
                for match in INCLUDE.finditer(text):
                    target = room_of(match.group(1))
                    if target is not None and rank[target] > rank[room]:
                        line = text.count("\n", 0, match.start()) + 1
                        found.append(f"{rel}:{line}: {room} includes {match.group(1)} "
                                     f"of {target}, which is above it")
    return found


def main():
    source_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(
        os.path.dirname(os.path.abspath(__file__)))
    missing = [room for room in ROOMS if not os.path.isdir(os.path.join(source_dir, room))]
    if missing:
        print(f"layout_check: rooms missing from {source_dir}: {', '.join(missing)}")
        return 1
    edges = back_edges(source_dir)
    for edge in edges:
        print(edge)
    if edges:
        print(f"layout_check: {len(edges)} include(s) point up the layers")
        return 1
    print(f"layout_check: {len(ROOMS)} rooms, every include points down")
    return 0


if __name__ == "__main__":
    sys.exit(main())
