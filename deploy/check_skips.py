"""Fails CI for a test that did not run where it should have.

Usage: python3 deploy/check_skips.py JUNIT_XML GPU_TESTS_FILE
JUNIT_XML is ctest's --output-junit report; GPU_TESTS_FILE is `ctest -N -L gpu`'s listing.
CTest reports a test that exited with its SKIP_RETURN_CODE (77), or that could not start,
as "not run", and still exits 0. On CI's machine only a missing GPU is a legitimate reason
(docs/testing.md): any other test not run is an error, named here.
"""

import re
import sys
import xml.etree.ElementTree as ElementTree


def main():
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    report, listing = sys.argv[1], sys.argv[2]
    gpu = set()
    with open(listing) as f:
        for line in f:
            match = re.match(r"\s*Test\s+#\d+: (.*)$", line.rstrip("\n"))
            if match:
                gpu.add(match.group(1))
    cases = ElementTree.parse(report).getroot().iter("testcase")
    not_run = [c.get("name") for c in cases if c.get("status") in ("notrun", "disabled")]
    allowed = [name for name in not_run if name in gpu]
    errors = [name for name in not_run if name not in gpu]
    print(f"check_skips: {len(allowed)} GPU test(s) skipped (no GPU here)")
    if errors:
        print(f"check_skips: FAIL: {len(errors)} test(s) did not run and need no GPU:",
              file=sys.stderr)
        for name in errors:
            print(f"  {name}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
