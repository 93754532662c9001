#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Runs web/bench/index.html in Debian's headless Chromium (Playwright) and prints its results as JSON.

Called by web/bench/bench.mjs --python PY (which writes the data the page reads); serves web/ on 127.0.0.1.
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))
from browser_test import free_port, serve  # noqa: E402
from playwright.sync_api import sync_playwright  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--queries", type=int, default=4)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--chromium", default="/usr/bin/chromium")
    ap.add_argument("--timeout", type=float, default=600)
    a = ap.parse_args()
    port = free_port()
    server = serve(port)
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=a.chromium, args=["--no-sandbox"])
            page = browser.new_page()
            page.goto(f"http://127.0.0.1:{port}/bench/index.html?queries={a.queries}&reps={a.reps}")
            page.wait_for_function("window.benchResult !== undefined", timeout=a.timeout * 1000)
            result = page.evaluate("window.benchResult")
            browser.close()
    finally:
        server.kill()
        server.wait()
    if "error" in result:
        print(f"browser_bench: the page failed: {result['error']}", file=sys.stderr)
        return 1
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
