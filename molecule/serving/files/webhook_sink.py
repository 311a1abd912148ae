#!/usr/bin/env python3
"""A webhook receiver for the test: append each POSTed body (one Alertmanager notification) as one
line of JSON to a file. Standard library only.

  webhook_sink.py --port 9099 --out /opt/gpuplat-test/alerts.jsonl
"""

from __future__ import annotations

import argparse
import json
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    class Sink(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            with open(args.out, "a", encoding="utf-8") as out:
                out.write(json.dumps(json.loads(body)) + "\n")
            self.send_response(200)
            self.end_headers()

    ThreadingHTTPServer(("127.0.0.1", args.port), Sink).serve_forever()


if __name__ == "__main__":
    main()
