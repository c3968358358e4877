"""A minimal S3-compatible server: objects in memory, only the requests the benchmarks send,
at a fraction of moto's cost per request. A benchmark rig, not a test double.

    python benches/python/lite_s3.py -H 127.0.0.1 -p PORT      (moto.server's arguments)

Why: behind the latency proxy, the S3 server shares the machine's 2 cores with the reader
under test. moto (Flask, its request parsing and response templates) spends ~1.8 ms of CPU on
each ranged GET even when it reads only the range (``ranged_moto.py``), so a reader that asks
for exactly the bytes it needs, in more requests, pays in the rig for work S3 does on its own
machines. This server answers a ranged GET with one slice of an in-memory buffer.

Served: create bucket (``PUT /b``), ``HEAD /b``, put object (``PUT /b/k``, plain or
``aws-chunked`` bodies), multipart uploads (``POST ?uploads``, ``PUT ?partNumber&uploadId``,
``POST ?uploadId``), ``HEAD``/``GET`` of an object with one optional byte range (``bytes=a-b``,
``a-``, ``-n``), ListObjectsV2 (``prefix``, ``delimiter``, ``max-keys``,
``continuation-token``, ``start-after``) and ``GET /moto-api/`` (so ``start_moto_server``
sees it up). Signatures are not checked. Anything else is a 501 naming the request, so a
client that needs more fails loudly instead of reading something wrong.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import threading
import time
import uuid
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlsplit
from xml.sax.saxutils import escape


class Store:
    """Buckets of immutable objects (bytes), and the parts of multipart uploads in progress."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.buckets: dict[str, dict[str, tuple[bytes, str, float]]] = {}
        self.uploads: dict[str, dict[int, bytes]] = {}

    def put(self, bucket: str, key: str, body: bytes) -> str:
        etag = f'"{hashlib.md5(body, usedforsecurity=False).hexdigest()}"'
        with self.lock:
            self.buckets[bucket][key] = (body, etag, time.time())
        return etag


def iso8601(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(t))


def decode_aws_chunked(body: bytes) -> bytes:
    """The payload of an ``aws-chunked`` body: ``hex-size[;ext]\\r\\n data \\r\\n`` ... up to a
    zero-size chunk (trailers after it are dropped)."""
    out = bytearray()
    at = 0
    while True:
        line_end = body.index(b"\r\n", at)
        size = int(body[at:line_end].split(b";", 1)[0], 16)
        at = line_end + 2
        if size == 0:
            return bytes(out)
        out += body[at : at + size]
        at += size + 2


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    store: Store

    def log_message(self, format: str, *args: object) -> None:
        pass

    # ------------------------------------------------------------------ plumbing

    def target(self) -> tuple[str, str, dict[str, list[str]]]:
        parts = urlsplit(self.path)
        path = unquote(parts.path).lstrip("/")
        bucket, _, key = path.partition("/")
        return bucket, key, parse_qs(parts.query, keep_blank_values=True)

    def body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            raw = bytearray()
            while True:
                size = int(self.rfile.readline().split(b";", 1)[0], 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    break
                raw += self.rfile.read(size)
                self.rfile.readline()
            data = bytes(raw)
        else:
            data = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        encoding = self.headers.get("Content-Encoding", "")
        streaming = self.headers.get("x-amz-content-sha256", "").startswith("STREAMING-")
        if "aws-chunked" in encoding or streaming:
            data = decode_aws_chunked(data)
        return data

    def send(
        self,
        status: int,
        body: bytes | memoryview = b"",
        headers: dict[str, str] | None = None,
        length: int | None = None,
    ) -> None:
        self.send_response(status)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body) if length is None else length))
        self.end_headers()
        if self.command != "HEAD" and body:
            self.wfile.write(body)

    def xml(self, status: int, text: str, headers: dict[str, str] | None = None) -> None:
        body = ('<?xml version="1.0" encoding="UTF-8"?>' + text).encode()
        self.send(status, body, {"Content-Type": "application/xml", **(headers or {})})

    def error(self, status: int, code: str, message: str) -> None:
        self.xml(
            status,
            f"<Error><Code>{code}</Code><Message>{escape(message)}</Message>"
            f"<Resource>{escape(self.path)}</Resource></Error>",
        )

    def objects(self, bucket: str) -> dict[str, tuple[bytes, str, float]] | None:
        objects = self.store.buckets.get(bucket)
        if objects is None:
            self.error(404, "NoSuchBucket", f"The bucket {bucket} does not exist")
        return objects

    # ------------------------------------------------------------------ verbs

    def do_PUT(self) -> None:
        bucket, key, query = self.target()
        body = self.body()
        if not key:
            with self.store.lock:
                self.store.buckets.setdefault(bucket, {})
            return self.send(200, headers={"Location": f"/{bucket}"})
        if self.objects(bucket) is None:
            return None
        if "uploadId" in query:
            upload = self.store.uploads.get(query["uploadId"][0])
            if upload is None:
                return self.error(404, "NoSuchUpload", "no such upload")
            upload[int(query["partNumber"][0])] = body
            etag = f'"{hashlib.md5(body, usedforsecurity=False).hexdigest()}"'
            return self.send(200, headers={"ETag": etag})
        etag = self.store.put(bucket, key, body)
        return self.send(200, headers={"ETag": etag})

    def do_POST(self) -> None:
        bucket, key, query = self.target()
        self.body()
        if self.objects(bucket) is None:
            return None
        if "uploads" in query:
            upload_id = uuid.uuid4().hex
            self.store.uploads[upload_id] = {}
            return self.xml(
                200,
                f"<InitiateMultipartUploadResult><Bucket>{escape(bucket)}</Bucket>"
                f"<Key>{escape(key)}</Key><UploadId>{upload_id}</UploadId>"
                "</InitiateMultipartUploadResult>",
            )
        if "uploadId" in query:
            parts = self.store.uploads.pop(query["uploadId"][0], None)
            if parts is None:
                return self.error(404, "NoSuchUpload", "no such upload")
            etag = self.store.put(bucket, key, b"".join(parts[n] for n in sorted(parts)))
            return self.xml(
                200,
                f"<CompleteMultipartUploadResult><Bucket>{escape(bucket)}</Bucket>"
                f"<Key>{escape(key)}</Key><ETag>{escape(etag)}</ETag>"
                "</CompleteMultipartUploadResult>",
            )
        return self.error(501, "NotImplemented", f"lite_s3 does not serve POST {self.path}")

    def do_HEAD(self) -> None:
        self.do_GET()

    def do_GET(self) -> None:
        bucket, key, query = self.target()
        if bucket == "moto-api":
            return self.send(200)
        objects = self.objects(bucket)
        if objects is None:
            return None
        if not key:
            if self.command == "HEAD":
                return self.send(200)
            if query.get("list-type") == ["2"]:
                return self.list_v2(bucket, objects, query)
            return self.error(501, "NotImplemented", f"lite_s3 does not serve GET {self.path}")
        found = objects.get(key)
        if found is None:
            return self.error(404, "NoSuchKey", f"The key {key} does not exist")
        data, etag, modified = found
        headers = {
            "ETag": etag,
            "Last-Modified": formatdate(modified, usegmt=True),
            "Accept-Ranges": "bytes",
            "Content-Type": "binary/octet-stream",
        }
        wanted = self.headers.get("Range")
        if wanted is None:
            return self.send(200, data, headers)
        size = len(data)
        first, _, last = wanted.removeprefix("bytes=").partition("-")
        if "," in wanted or not wanted.startswith("bytes="):
            return self.error(501, "NotImplemented", f"lite_s3 serves one range, not {wanted}")
        if first == "":
            start, stop = max(0, size - int(last)), size
        else:
            start, stop = int(first), size if last == "" else min(size, int(last) + 1)
        if start >= size or start >= stop:
            return self.send(416, headers={"Content-Range": f"bytes */{size}"}, length=0)
        headers["Content-Range"] = f"bytes {start}-{stop - 1}/{size}"
        # A view, not a copy: the rig holds no bytes of its own for a response in flight.
        return self.send(206, memoryview(data)[start:stop], headers)

    def list_v2(
        self, bucket: str, objects: dict[str, tuple[bytes, str, float]], query: dict
    ) -> None:
        prefix = query.get("prefix", [""])[0]
        delimiter = query.get("delimiter", [""])[0]
        max_keys = int(query.get("max-keys", ["1000"])[0])
        after = query.get("continuation-token", query.get("start-after", [""]))[0]
        if "continuation-token" in query:
            after = base64.urlsafe_b64decode(after).decode()
        contents: list[str] = []
        prefixes: list[str] = []
        truncated = False
        last = ""
        with self.store.lock:
            keys = sorted(k for k in objects if k.startswith(prefix) and k > after)
        for k in keys:
            if len(contents) + len(prefixes) == max_keys:
                truncated = True
                break
            if delimiter and delimiter in k[len(prefix) :]:
                common = k[: k.index(delimiter, len(prefix)) + len(delimiter)]
                if prefixes and prefixes[-1] == common:
                    continue
                prefixes.append(common)
                last = common + "\U0010ffff"
                continue
            data, etag, modified = objects[k]
            contents.append(
                f"<Contents><Key>{escape(k)}</Key><LastModified>{iso8601(modified)}"
                f"</LastModified><ETag>{escape(etag)}</ETag><Size>{len(data)}</Size>"
                "<StorageClass>STANDARD</StorageClass></Contents>"
            )
            last = k
        token = ""
        if truncated:
            token = base64.urlsafe_b64encode(last.encode()).decode()
            token = f"<NextContinuationToken>{escape(token)}</NextContinuationToken>"
        self.xml(
            200,
            '<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">'
            f"<Name>{escape(bucket)}</Name><Prefix>{escape(prefix)}</Prefix>"
            f"<KeyCount>{len(contents) + len(prefixes)}</KeyCount><MaxKeys>{max_keys}</MaxKeys>"
            f"<Delimiter>{escape(delimiter)}</Delimiter>"
            f"<IsTruncated>{'true' if truncated else 'false'}</IsTruncated>{token}"
            + "".join(contents)
            + "".join(
                f"<CommonPrefixes><Prefix>{escape(p)}</Prefix></CommonPrefixes>" for p in prefixes
            )
            + "</ListBucketResult>",
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-H", "--host", default="127.0.0.1")
    parser.add_argument("-p", "--port", type=int, default=5000)
    args = parser.parse_args()
    Handler.store = Store()
    # Readers open a hundred connections at once; the default backlog (5) would drop their
    # SYNs and leave them waiting seconds for the kernel's retransmit.
    ThreadingHTTPServer.request_queue_size = 1024
    server = ThreadingHTTPServer((args.host, args.port), Handler)
    server.daemon_threads = True
    print(f"lite_s3 on http://{args.host}:{args.port}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
