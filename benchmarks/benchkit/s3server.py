"""moto's S3 server with ranged GETs that read only their range: the S3 side of the ``s3fs`` source.

moto (5.x) answers ``GET`` with ``Range: bytes=A-B`` by reading the whole object into memory and
slicing it, so every ranged GET of a 1 GiB object costs a 1 GiB copy: over s3fs (10 MiB parallel
parts) a checkpoint load would measure moto, not s3fs or fastfs. This launcher patches one method,
``S3Response.key_response``: a plain single-range GET of an existing key (no version, part number,
conditional header or query) is answered from the key's own buffer at the range (seek + read under
the key's lock), with the headers moto would send (ETag, Last-Modified, metadata, Content-Range);
everything else is moto's own code. Objects keep living where moto keeps them (memory, spilled to
``TMPDIR`` above 8 MiB).

Run: ``python s3server.py HOST PORT`` (what :func:`benchkit.netsources.s3fs_source` starts). The
access log (one line per request, method and path) is Werkzeug's, on stderr.
"""

from __future__ import annotations

import re
import sys
from typing import Any

# A single byte range ``bytes=BEGIN-[END]`` (suffix ranges and lists go to moto's own code).
RANGE = re.compile(r"^bytes=(\d+)-(\d*)$")
# Request headers that make a GET conditional (left to moto).
CONDITIONAL = ("if-match", "if-none-match", "if-modified-since", "if-unmodified-since")


def install_ranged_get() -> None:
    from moto.s3.responses import S3Response

    original = S3Response.key_response

    def key_response(self: Any, request: Any, full_url: str, headers: Any) -> Any:
        m = RANGE.match(request.headers.get("range", ""))
        if request.method != "GET" or m is None or "?" in full_url or any(h in request.headers for h in CONDITIONAL):
            return original(self, request, full_url, headers)
        self.setup_class(request, full_url, headers)
        key = self.backend.get_object(self.bucket_name, self.parse_key_name())
        begin = int(m.group(1))
        if key is None or begin >= key.size:
            return original(self, request, full_url, headers)
        end = min(int(m.group(2)) if m.group(2) else key.size - 1, key.size - 1)
        with key.lock:
            key._value_buffer.seek(begin)
            content = key._value_buffer.read(end - begin + 1)
        out = dict(key.response_dict)
        out.update(key.metadata)
        out["Accept-Ranges"] = "bytes"
        out["content-range"] = f"bytes {begin}-{end}/{key.size}"
        out["content-length"] = str(len(content))
        return 206, out, content

    S3Response.key_response = key_response


def main(argv: list[str]) -> int:
    if len(argv) != 2 or not argv[1].isdigit():
        print("usage: s3server.py HOST PORT", file=sys.stderr)
        return 2
    install_ranged_get()
    from moto.server import main as moto_main

    moto_main(["-H", argv[0], "-p", argv[1]])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
