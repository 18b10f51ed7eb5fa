"""Load test of ``vlmatch serve`` on loopback: throughput, latency, errors and memory under concurrent clients.

Builds (once, cached) a synthetic index of N images (random 49-region features, an untrained SCAN t-i
re-scorer with a VSE++ retriever for stage 1: the compute per query is the real one, the rankings are
meaningless), starts ``vlmatch serve`` on 127.0.0.1, and runs two phases:

1. below the queue limit: C clients (default 8) for T seconds (default 30) against a server whose
   workers + queue exceed C: every request must succeed;
2. above it: the same clients against a server with 1 worker and a queue of 2: the overflow must be
   answered 503 at once (no other error, no crash), and the server must still answer afterwards.

Each client is a thread with a keep-alive connection sending ``GET /search?q=...`` back to back with
queries drawn from a fixed list. The server's RSS is sampled every 0.5 s. Results:
``benchmarks/results/service_load.json`` and ``.md``. Loopback only; bounded in time and count.

    python benchmarks/service_load.py                  # 10k images, 8 clients x 30 s, then the overflow phase
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

from vlmatch_lab.paths import cache_root

HERE = Path(__file__).resolve().parent
WORDS = ["a dog runs on the beach", "two children play in the snow", "a man rides a red bicycle",
         "a woman in a blue dress", "people walk down a busy street", "a black cat on a sofa",
         "a boy jumps into the water", "a group of people at a concert", "a brown horse in a field",
         "a girl with a yellow kite", "a surfer rides a wave", "an old man sits on a bench"]


def build_synthetic_index(folder: Path, n: int, img_dim: int, embed_dim: int, regions: int = 49) -> Path:
    """An index of ``n`` synthetic images built by ``vlmatch index build`` code (cached by its arguments)."""
    import torch

    from vlmatch import create_model
    from vlmatch.data.vocab import Vocab
    from vlmatch.search.build import build_index

    index = folder / f"index-{n}-{img_dim}-{embed_dim}"
    if (index / "manifest.json").is_file():
        return index
    torch.manual_seed(0)
    vocab = Vocab.build(WORDS, 1)
    ck = {}
    for name in ("scan_t2i_avg", "vsepp"):
        m = create_model(name, img_dim=img_dim, embed_dim=embed_dim, word_dim=64, vocab_size=len(vocab))
        m.vocab = vocab
        ck[name] = m.save(folder / f"ckpt-{name}-{img_dim}-{embed_dim}")
    feats = folder / f"features-{n}-{img_dim}"
    if not (feats / "test_ims.npy").is_file():
        feats.mkdir(parents=True, exist_ok=True)
        rng = np.random.default_rng(0)
        arr = np.lib.format.open_memmap(feats / "test_ims.npy.tmp", "w+", np.float32, (n, regions, img_dim))
        for s in range(0, n, 1000):
            arr[s:s + 1000] = rng.standard_normal((min(1000, n - s), regions, img_dim), dtype=np.float32)
        arr.flush()
        del arr
        os.replace(feats / "test_ims.npy.tmp", feats / "test_ims.npy")
    build_index(index, ck["scan_t2i_avg"], features=feats, split="test", retriever_ckpt=ck["vsepp"], progress=True)
    return index


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


class Server:
    def __init__(self, index: Path, workers: int, queue: int):
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}  # the server runs the same vlmatch
        self.proc = subprocess.Popen([sys.executable, "-m", "vlmatch.cli", "serve", str(index), "--port", str(self.port),
                                      "--workers", str(workers), "--queue", str(queue), "--log-level", "warning"],
                                     env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        import httpx

        deadline = time.time() + 120
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"server exited: {self.proc.stdout.read()}")
            try:
                self.health = httpx.get(self.base + "/health", timeout=2).json()
                return
            except httpx.HTTPError:
                time.sleep(0.2)
        self.stop()
        raise SystemExit("server did not answer /health within 120 s")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def run_phase(server: Server, clients: int, seconds: float, k: int, candidates: int) -> dict:
    import httpx

    records: list[tuple[float, float, int]] = []  # (start offset s, latency s, status)
    lock = threading.Lock()
    t_start = time.perf_counter()
    deadline = t_start + seconds
    rss: list[tuple[float, float]] = []
    stop = threading.Event()

    def sample():
        while not stop.is_set():
            rss.append((time.perf_counter() - t_start, rss_mb(server.proc.pid)))
            stop.wait(0.5)

    def client(seed: int):
        rng = np.random.default_rng(seed)
        mine = []
        with httpx.Client(base_url=server.base, timeout=60) as c:
            while (t0 := time.perf_counter()) < deadline:
                q = WORDS[int(rng.integers(len(WORDS)))]
                try:
                    status = c.get("/search", params={"q": q, "k": k, "candidates": candidates}).status_code
                except httpx.HTTPError:
                    status = -1  # connection error: counted as an error
                mine.append((t0 - t_start, time.perf_counter() - t0, status))
        with lock:
            records.extend(mine)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - t_start
    stop.set()
    sampler.join()
    ok = np.array([lat for _, lat, s in records if s == 200])
    statuses: dict[str, int] = {}
    for _, _, s in records:
        statuses[str(s)] = statuses.get(str(s), 0) + 1
    warm = [m for t, m in rss if t >= min(5.0, seconds / 3)]
    alive = server.proc.poll() is None
    return {
        "clients": clients, "seconds": round(elapsed, 2), "requests": len(records), "ok": int(ok.size),
        "throughput_rps": round(ok.size / elapsed, 2),
        "p50_ms": round(float(np.percentile(ok, 50)) * 1e3, 1) if ok.size else None,
        "p99_ms": round(float(np.percentile(ok, 99)) * 1e3, 1) if ok.size else None,
        "max_ms": round(float(ok.max()) * 1e3, 1) if ok.size else None,
        "statuses": statuses,
        "errors_other_than_503": sum(v for s, v in statuses.items() if s not in ("200", "503")),
        "rss_mb": {"start": round(rss[0][1], 1), "after_warmup": round(warm[0], 1) if warm else None,
                   "end": round(rss[-1][1], 1), "max": round(max(m for _, m in rss), 1)},
        "server_alive": alive,
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--images", type=int, default=10_000)
    ap.add_argument("--img-dim", type=int, default=256)
    ap.add_argument("--embed-dim", type=int, default=256)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=30)
    ap.add_argument("--over-seconds", type=float, default=10, help="duration of the overflow phase")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--queue", type=int, default=16)
    ap.add_argument("-k", type=int, default=10)
    ap.add_argument("--candidates", type=int, default=100)
    ap.add_argument("--cache", default=str(cache_root() / "service_load"))
    ap.add_argument("--out", default=str(HERE / "results" / "service_load.json"))
    a = ap.parse_args(argv)
    if a.workers + a.queue < a.clients:
        raise SystemExit("phase 1 needs workers + queue >= clients (it must see no 503)")
    from vlmatch.io import write_json, write_text

    t0 = time.perf_counter()
    index = build_synthetic_index(Path(a.cache), a.images, a.img_dim, a.embed_dim)
    build_s = time.perf_counter() - t0
    phases = {}
    for name, (workers, queue, seconds) in {"below_queue_limit": (a.workers, a.queue, a.seconds),
                                            "above_queue_limit": (1, 2, a.over_seconds)}.items():
        server = Server(index, workers, queue)
        try:
            print(f"{name}: {a.clients} clients x {seconds:g} s, {workers} workers + queue {queue} "
                  f"({server.health['index_size']} images)", flush=True)
            res = run_phase(server, a.clients, seconds, a.k, a.candidates)
            import httpx

            res["health_after"] = httpx.get(server.base + "/health", timeout=10).status_code
            res.update(workers=workers, queue=queue)
        finally:
            server.stop()
        phases[name] = res
        print(json.dumps(res), flush=True)
    below, above = phases["below_queue_limit"], phases["above_queue_limit"]
    checks = {
        "no errors below the queue limit": below["ok"] == below["requests"] and below["requests"] > 0,
        "only 503 above it": above["errors_other_than_503"] == 0 and above["statuses"].get("503", 0) > 0,
        "server alive and healthy after both": all(p["server_alive"] and p["health_after"] == 200 for p in phases.values()),
        "memory flat (end within 5% + 20 MB of after warm-up)": below["rss_mb"]["end"]
        <= below["rss_mb"]["after_warmup"] * 1.05 + 20,
    }
    args = list(argv if argv is not None else sys.argv[1:])
    if "--out" in args:  # where the file went is not part of how to reproduce it
        i = args.index("--out")
        del args[i:i + 2]
    out = {"command": " ".join(["python benchmarks/service_load.py", *args]),
           "index": {"images": a.images, "regions": 49, "img_dim": a.img_dim, "embed_dim": a.embed_dim,
                     "model": "scan_t2i_avg (untrained) + vsepp retriever", "build_or_load_s": round(build_s, 1)},
           "k": a.k, "candidates": a.candidates, "phases": phases, "checks": checks,
           "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
           "note": "clients run in the same machine as the server (2 cores shared), so the figures are a floor"}
    write_json(a.out, out)
    md = ["# `vlmatch serve` under load (loopback)", "",
          f"Command: `{out['command'].strip()}`. Index: {a.images} synthetic images (49 regions, {a.img_dim}-d features), "
          f"SCAN t-i re-scoring K={a.candidates} candidates from a VSE++ stage 1; `GET /search?q=...&k={a.k}`; "
          f"{os.cpu_count()} CPU cores shared by server and clients.", "",
          "| phase | workers + queue | clients x s | requests | ok | 503 | other errors | req/s | p50 ms | p99 ms | "
          "RSS MB (warm -> end, max) |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, p in phases.items():
        r = p["rss_mb"]
        md.append(f"| {name.replace('_', ' ')} | {p['workers']} + {p['queue']} | {p['clients']} x {p['seconds']:g} | "
                  f"{p['requests']} | {p['ok']} | {p['statuses'].get('503', 0)} | {p['errors_other_than_503']} | "
                  f"{p['throughput_rps']} | {p['p50_ms']} | {p['p99_ms']} | {r['after_warmup']} -> {r['end']}, {r['max']} |")
    md += ["", "Checks: " + "; ".join(f"{k}: {'yes' if v else 'NO'}" for k, v in checks.items()), ""]
    write_text(Path(a.out).with_suffix(".md"), "\n".join(md))
    print("\n".join(md))
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
