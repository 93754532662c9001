#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The in-browser demo (web/demo/) in a real browser: Debian's Chromium, headless, driven by Playwright.

Packs the shared ColBERTv2 embeddings with the native CLI into web/demo/data/ (ignored by git), serves web/
with `python3 -m http.server` on 127.0.0.1, loads the demo page, waits for its results and checks them: no
error, certified == exact on every score, and each query's top 10 (document, id, f32 score bits) equal to the
native CLI's `maxsim search` output. Saves a screenshot and the page's results in --out.

  python3 web/tests/browser_test.py --cli build/lib/cli/maxsim [--shared ../shared] [--out build-web/artifacts]
"""
import argparse
import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import time

from playwright.sync_api import sync_playwright

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WEB = os.path.join(ROOT, "web")


def f32_bits(x):
    return struct.unpack("<I", struct.pack("<f", x))[0]


def write_ids_npy(ids, path):
    """Numeric ids as an int64 .npy (the CLI stores a text file's lines as string ids instead)."""
    header = "{'descr': '<i8', 'fortran_order': False, 'shape': (%d,), }" % len(ids)
    header += " " * (63 - (10 + len(header)) % 64) + "\n"
    with open(path, "wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode("latin1"))
        f.write(struct.pack("<%dq" % len(ids), *ids))


def prepare_data(cli, data_dir, out_dir):
    os.makedirs(out_dir, exist_ok=True)
    for name in ("queries_tokens.npy", "queries_offsets.npy", "docs_tokens.npy", "docs_offsets.npy"):
        shutil.copyfile(os.path.join(data_dir, name), os.path.join(out_dir, name))
    with open(os.path.join(data_dir, "docs_ids.txt")) as f:
        write_ids_npy([int(line) for line in f if line.strip()], os.path.join(out_dir, "docs_ids.npy"))
    subprocess.run([cli, "pack", os.path.join(data_dir, "docs_tokens.npy"), os.path.join(data_dir, "docs_offsets.npy"),
                    "--ids", os.path.join(out_dir, "docs_ids.npy"), "-o", os.path.join(out_dir, "corpus.maxsim")],
                   check=True, stdout=subprocess.DEVNULL)
    out = subprocess.run([cli, "search", os.path.join(out_dir, "corpus.maxsim"),
                          os.path.join(data_dir, "queries_tokens.npy"), os.path.join(data_dir, "queries_offsets.npy"),
                          "-k", "10", "--mode", "exact", "--format", "json", "--no-progress"],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(port):
    server = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1", "--directory",
                               WEB], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(100):
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return server
        except OSError:
            time.sleep(0.1)
    server.kill()
    raise RuntimeError(f"http.server did not start on port {port}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cli", required=True, help="the native maxsim binary")
    ap.add_argument("--shared", default=os.environ.get("MAXSIM_SHARED_DIR", os.path.join(ROOT, "..", "shared")))
    ap.add_argument("--out", default=os.path.join(ROOT, "build-web", "artifacts"))
    ap.add_argument("--chromium", default="/usr/bin/chromium")
    ap.add_argument("--timeout", type=float, default=300, help="seconds to wait for the page's results")
    a = ap.parse_args()
    data_dir = os.path.join(a.shared, "data", "colbert-nanofiqa")
    if not os.path.exists(os.path.join(data_dir, "docs_tokens.npy")):
        print(f"browser_test: SKIP: no shared data at {data_dir}")
        return 0
    for module in ("maxsim-simd128.wasm", "maxsim-relaxed.wasm"):
        if not os.path.exists(os.path.join(WEB, module)):
            print(f"browser_test: web/{module} is missing (scripts/lanes/wasm.sh builds and copies it)")
            return 1
    expected = prepare_data(a.cli, data_dir, os.path.join(WEB, "demo", "data"))
    os.makedirs(a.out, exist_ok=True)
    port = free_port()
    server = serve(port)
    console = []
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=a.chromium, args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 1200, "height": 1000})
            page.on("console", lambda m: console.append(f"{m.type}: {m.text}"))
            page.on("pageerror", lambda e: console.append(f"pageerror: {e}"))
            page.goto(f"http://127.0.0.1:{port}/demo/index.html")
            page.wait_for_function("window.demoResult !== undefined", timeout=a.timeout * 1000)
            result = page.evaluate("window.demoResult")
            page.screenshot(path=os.path.join(a.out, "demo.png"), full_page=True)
            user_agent = page.evaluate("navigator.userAgent")
            browser.close()
    finally:
        server.kill()
        server.wait()
    result["userAgent"] = user_agent
    with open(os.path.join(a.out, "demo-result.json"), "w") as f:
        json.dump(result, f, indent=1)
    problems = []
    if "error" in result:
        problems.append(f"the page failed: {result['error']}")
    else:
        if not result["certifiedEqualsExact"]:
            problems.append("certified != exact in the browser")
        for r in expected["results"]:
            got = result["top"][r["query"]]
            if len(got) != len(r["hits"]):
                problems.append(f"query {r['query']}: {len(got)} hits in the browser, {len(r['hits'])} from the CLI")
            for h, g in zip(r["hits"], got):
                want_id = str(h.get("doc_id", h.get("id")))
                if g["index"] != h["doc"] or g["id"] != want_id or f32_bits(g["score"]) != f32_bits(h["score"]):
                    problems.append(f"query {r['query']} rank {h['rank']}: browser doc {g['index']} id {g['id']} "
                                    f"score {g['score']!r}, CLI doc {h['doc']} id {want_id} score {h['score']!r}")
    for line in console:
        print(f"browser_test: console {line}")
    if problems:
        for pr in problems:
            print(f"browser_test: FAIL: {pr}")
        return 1
    print(f"browser_test: ok: {user_agent}; module {result['module']} (kernel {result['kernel']}), "
          f"top 10 of {len(expected['results'])} queries equal to the native CLI ({expected['kernel']}), "
          f"certified == exact; exact {result['timings']['exact']:.3f} ms/query, certified "
          f"{result['timings']['certified']:.3f} ms/query; screenshot {os.path.join(a.out, 'demo.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
