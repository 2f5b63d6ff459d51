#!/usr/bin/env python3
"""A pod flooding its dynamic volume's socket: `flood.py VOLUME_DIR REFERENCE THREADS`.

The socket is VOLUME_DIR/csi.sock, reached through /proc/self/fd of the directory (kubelet's
paths are longer than a unix socket address may be; a pod's own path to it is short).

Each thread keeps one HTTP/1.1 connection open (a new one when the server closes it) and sends,
in turn and as fast as the answers come: POST /mounts of REFERENCE under a new id, DELETE of the
id before, GET /mounts, GET /mounts/{id} and a request with a malformed body. On SIGTERM it
prints one JSON line: answers by status, connection errors and the seconds it ran.
"""
import http.client
import json
import os
import signal
import socket
import sys
import threading
import time


class UnixConnection(http.client.HTTPConnection):
    def __init__(self, path):
        super().__init__("v", timeout=30)
        self.unix_path = path

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(self.unix_path)


def main():
    directory, reference, threads = sys.argv[1], sys.argv[2], int(sys.argv[3])
    path = f"/proc/self/fd/{os.open(directory, os.O_PATH)}/csi.sock"
    counts, errors, lock, stop = {}, [0], threading.Lock(), threading.Event()
    started = time.monotonic()

    def worker(t):
        conn, n = None, 0
        while not stop.is_set():
            n += 1
            mid = f"f{t}x{n}"
            requests = [
                ("POST", "/mounts", json.dumps({"id": mid, "parameters": {"reference": reference}})),
                ("DELETE", f"/mounts/f{t}x{n - 1}", None),
                ("GET", "/mounts", None),
                ("GET", f"/mounts/{mid}", None),
                ("POST", "/mounts", "{not json"),
            ]
            for method, url, body in requests:
                try:
                    if conn is None:
                        conn = UnixConnection(path)
                    headers = {"Content-Type": "application/json"} if body else {}
                    conn.request(method, url, body=body, headers=headers)
                    answer = conn.getresponse()
                    answer.read()
                    with lock:
                        counts[answer.status] = counts.get(answer.status, 0) + 1
                    if answer.will_close:
                        conn.close()
                        conn = None
                except (OSError, http.client.HTTPException):
                    with lock:
                        errors[0] += 1
                    if conn is not None:
                        conn.close()
                    conn = None
                    time.sleep(0.001)

    def finish(*_):
        stop.set()

    signal.signal(signal.SIGTERM, finish)
    workers = [threading.Thread(target=worker, args=(t,), daemon=True) for t in range(threads)]
    for w in workers:
        w.start()
    print("flooding", flush=True)
    while not stop.is_set():
        stop.wait(0.1)
    for w in workers:
        w.join(timeout=5)
    with lock:
        report = {"answers": {str(k): v for k, v in sorted(counts.items())}, "errors": errors[0],
                  "seconds": round(time.monotonic() - started, 2)}
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
