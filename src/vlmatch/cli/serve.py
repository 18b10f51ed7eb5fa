"""``vlmatch serve INDEX``: the HTTP API and web page over an index, with uvicorn."""

from __future__ import annotations

import math
import os

from ..errors import ConfigError
from .common import checked

MAX_UPLOAD_MB = 1024.0  # the largest --max-upload-mb: the body of an upload request is held whole


# an argparse type: a finite number of megabytes above 0 (one byte at least), at most MAX_UPLOAD_MB
upload_megabytes = checked(float, lambda v: math.isfinite(v) and 0 < v <= MAX_UPLOAD_MB and int(v * 2**20) >= 1,
                           "expected a number of megabytes, got {text}",
                           f"expected a number of megabytes above 0 and at most {MAX_UPLOAD_MB:g}, got {{text}}")


def add_parser(sub):
    p = sub.add_parser("serve", help="serve an index over HTTP: a search page at / and a JSON API",
                       description="Serve the index at INDEX: the search page at http://HOST:PORT/ and the JSON API "
                                   "(POST /search, GET /search?q=, POST /search/image, /images/{id}, /thumbs/{id}, "
                                   "/explain/{id}, /explain/{id}.png, /health; schema at /openapi.json). Listens on "
                                   "localhost only unless --host says otherwise.")
    p.add_argument("index", nargs="?", help="index folder (vlmatch index build; omit with --backend milvus)")
    from .common import add_backend_args

    add_backend_args(p)
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--workers", type=int, default=2, help="threads doing model work (default 2)")
    p.add_argument("--queue", type=int, default=16, help="requests that may wait for a worker; more get 503 (default 16)")
    p.add_argument("--max-upload-mb", type=upload_megabytes, default=8.0,
                   help=f"largest accepted image upload in MiB (default 8; above 0, at most {MAX_UPLOAD_MB:g})")
    p.add_argument("--reload-every", type=float, default=2.0, metavar="SECONDS",
                   help="look this often for a version of the index committed since (index build --overwrite, index "
                        "update) and serve it; requests in flight finish on the old one (default 2; 0: never)")
    p.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    p.set_defaults(func=cmd_serve)


def cmd_serve(a):
    import torch
    import uvicorn

    from ..search.service import IndexBackend, Limits, create_app

    if a.workers < 1 or a.queue < 0:
        raise ConfigError("--workers must be at least 1 and --queue at least 0")
    if not 0 < a.port < 65536:
        raise ConfigError(f"--port {a.port} is not a TCP port")
    # the worker threads share torch's intra-op pool: split the cores between them
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // a.workers))
    if not (math.isfinite(a.reload_every) and a.reload_every >= 0):
        raise ConfigError(f"--reload-every {a.reload_every}: give a number of seconds >= 0 (0: never)")
    from .common import open_index

    backend = IndexBackend(open_index(a, a.index), lambda: open_index(a, a.index))
    a.index = a.index or str(backend.root)
    if a.reload_every > 0:
        backend.watch(a.reload_every)
    app = create_app(backend, Limits(workers=a.workers, queue=a.queue, max_upload_bytes=int(a.max_upload_mb * 2**20)))
    print(f"serving {a.index} ({backend.size} images, model {backend.model_name}, version {backend.version}) at "
          f"http://{a.host}:{a.port}/", flush=True)
    uvicorn.run(app, host=a.host, port=a.port, log_level=a.log_level)
