"""Sizing a Milvus cluster for vlmatch, on paper: what each photo costs where, at 10M and 100M photos, computed from
the index layout (docs/milvus.md, "What is stored where") and the index formats with the parameters below (HNSW's M
is vlmatch's own default; IVF_PQ's m and nlist and DiskANN's degree are common settings, not Milvus defaults).
Nothing here is measured; the recall and latency ranges of the stage-1 index types are the usual published ones,
recorded as inputs. Per-photo sizes are in KiB (1,024 bytes); totals in decimal units (GB = 10^9 bytes).

    python benchmarks/milvus_sizing.py           # -> benchmarks/results/milvus_sizing.json, docs/milvus.md's block
    python benchmarks/milvus_sizing.py --check   # exit 1 if docs/milvus.md's block is not what the inputs give
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from vlmatch.io import write_json, write_text

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "milvus_sizing.json"
PAGE = HERE.parent / "docs" / "milvus.md"
BEGIN, END = "<!-- milvus-sizing:begin -->", "<!-- milvus-sizing:end -->"

INPUTS = {
    "dim": 1024,  # the shipped default's embedding (one per photo)
    "hnsw_m": 32,  # links per node on the base layer: 2 M of 4 bytes
    "table_row_bytes": 256,  # a photo's JSON row (path, dates, place, camera, digest): about a quarter KiB
    "cells": {"7 x 7 x 512 cells (the first pair's SCAN re-scorer)": [7, 7, 512],
              "14 x 14 x 512 cells (100,352 x float16, split into 4 rows)": [14, 14, 512]},
    "photos": [10_000_000, 100_000_000],
    "node_memory_gb": 64,
    "node_usable_share": 0.75,  # of a query node's memory: the rest for the process, segments loading, headroom
    "queries_per_second": 50,
    "candidates": 100,  # stage 1's top k, re-scored by stage 2
    "ivf_pq": {"m": 64, "bits": 8, "id_bytes": 8, "nlist": 16384},
    "diskann": {"pq_share": 1 / 8, "graph_degree": 64},
    "max_vector_dim": 32768,  # a Milvus vector field's most dimensions: larger encodings split into rows
    "published": {  # the usual published ranges for these index types: not measured here beyond 100,000 photos
        "HNSW": {"recall_at_10": "0.95-0.99", "latency_ms": "1-5"},
        "IVF_PQ": {"recall_at_10": "0.5-0.8 (rises with nprobe; stage 2 recovers part)", "latency_ms": "2-10"},
        "DiskANN": {"recall_at_10": "0.95+ (search_list 100)", "latency_ms": "5-15 (NVMe reads)"},
    },
}


def kib(b: float) -> float:
    return b / 1024


def size(b: float) -> str:
    """Bytes in decimal units: one decimal under 10, whole units from 10 (as a sizing table reads)."""
    for unit, f in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if b >= f:
            v = b / f
            return f"{v:.1f} {unit}" if v < 10 else f"{v:.0f} {unit}"
    return f"{b:.0f} B"


def compute(i: dict = INPUTS) -> dict:
    d = i["dim"]
    stage1, graph, stage2 = 4 * d, 2 * i["hnsw_m"] * 4, 2 * d
    cells = {k: 2 * math.prod(v) for k, v in i["cells"].items()}
    row = i["table_row_bytes"]
    pq = i["ivf_pq"]
    ivf = pq["m"] * pq["bits"] // 8 + pq["id_bytes"]
    disk_mem = stage1 * i["diskann"]["pq_share"]
    disk_nvme = stage1 + 4 * i["diskann"]["graph_degree"]
    usable = i["node_memory_gb"] * 1e9 * i["node_usable_share"]
    at = {}
    for n in i["photos"]:
        memory = n * (stage1 + graph + row)  # per replica: stage 1, its graph, the table
        nodes = math.ceil(memory / usable)
        at[str(n)] = {
            "stage1_and_graph": n * (stage1 + graph), "stage2_default": n * stage2,
            "stage2_cells": {k: n * v for k, v in cells.items()}, "table": n * row,
            "memory_per_replica": memory, "query_nodes_per_replica": nodes,
            "disk_per_node_default": n * stage2 / nodes,
            "disk_per_node_cells": {k: n * v / nodes for k, v in cells.items()},
            "object_storage_default": n * (stage1 + stage2 + row),
            "object_storage_cells": {k: n * (stage1 + v + row) for k, v in cells.items()},
            "ivf_pq_memory": n * ivf, "diskann_memory": n * disk_mem, "diskann_nvme": n * disk_nvme,
        }
    c = i["candidates"]
    first_cells = next(iter(cells.values()))
    return {"per_photo_bytes": {"stage1": stage1, "hnsw_graph": graph, "stage2_default": stage2, "stage2_cells": cells,
                                "table_row": row, "ivf_pq": ivf, "diskann_memory": disk_mem,
                                "diskann_nvme": disk_nvme},
            "at": at,
            "per_query_bytes": {"stage2_default": c * stage2, "stage2_cells": {k: c * v for k, v in cells.items()}},
            "per_second_bytes": {"stage2_default": i["queries_per_second"] * c * stage2,
                                 "stage2_cells": i["queries_per_second"] * c * first_cells}}


def nodes(n: int) -> str:
    return f"{n} query node" + ("" if n == 1 else "s")


def render(i: dict, r: dict) -> str:
    p, ten, hun = r["per_photo_bytes"], r["at"][str(i["photos"][0])], r["at"][str(i["photos"][1])]
    (c7, c14) = list(i["cells"])
    lines = [
        "| part | per photo | 10M photos | 100M photos | where it lives |", "|---|---:|---:|---:|---|",
        f"| stage 1 ({i['dim']} x float32) + HNSW graph (M = {i['hnsw_m']}) | {kib(p['stage1']):.1f} KiB + "
        f"{kib(p['hnsw_graph']):.2f} KiB | {size(ten['stage1_and_graph'])} | {size(hun['stage1_and_graph'])} | "
        "query-node **memory**, per replica |",
        f"| stage 2, the default ({i['dim']} x float16) | {kib(p['stage2_default']):.1f} KiB | "
        f"{size(ten['stage2_default'])} | {size(hun['stage2_default'])} | object storage once; query-node **local "
        "disk** (mmap), per replica |"]
    for k in (c7, c14):
        lines.append(f"| stage 2, {k} | {kib(p['stage2_cells'][k]):.0f} KiB | {size(ten['stage2_cells'][k])} | "
                     f"{size(hun['stage2_cells'][k])} | likewise |")
    rows14 = math.ceil(math.prod(i["cells"][c14]) / i["max_vector_dim"])
    lines += [f"| table rows (JSON) | {kib(p['table_row']):.2f} KiB | {size(ten['table'])} | {size(hun['table'])} | "
              "query-node memory |", "",
              f"Per photo in KiB (1,024 bytes), totals in decimal units (GB: 10^9 bytes). Stage 1 is the default's "
              f"{i['dim']}-d vector (the first pair's is 512-d); a Milvus vector field holds at most "
              f"{i['max_vector_dim']:,} dimensions, so 14 x 14 x 512 cells take {rows14} rows.", ""]
    for n, a in ((f"{i['photos'][0] // 10**6}M", ten), (f"{i['photos'][1] // 10**6}M", hun)):
        lines.append(
            f"- **{n} photos.** {size(a['memory_per_replica'])} of memory per replica for stage 1, its graph and the "
            f"table: {nodes(a['query_nodes_per_replica'])} of {i['node_memory_gb']} GB per replica at "
            f"{100 * i['node_usable_share']:.0f} % use ({nodes(2 * a['query_nodes_per_replica'])} with 2 replicas). "
            "With the default "
            f"model each node needs about {size(a['disk_per_node_default'])} of local disk for its share of "
            f"stage 2; with {c7.split(' (')[0]} about {size(a['disk_per_node_cells'][c7])} of NVMe. Object storage "
            f"(S3 / MinIO) holds {size(a['object_storage_default'])} (default) or "
            f"{size(a['object_storage_cells'][c7])} ({c7.split(' (')[0]}).")
    q, s = r["per_query_bytes"], r["per_second_bytes"]
    lines += [
        f"- **Per query,** stage 1 is one ANN search (top {i['candidates']}), and stage 2 fetches the candidates' "
        f"encodings by primary key: {size(q['stage2_default'])} with the default model, "
        f"{size(q['stage2_cells'][c7])} with {c7.split(' (')[0]} ({size(q['stage2_cells'][c14])} on 14 x 14 grids). "
        f"At {i['queries_per_second']} queries per second that is {size(s['stage2_default'])}/s of reads (default) "
        f"or {size(s['stage2_cells'])}/s of random reads ({c7.split(' (')[0]}) across the query nodes' disks (less "
        "what the page cache holds).", "",
        "Stage-1 index per vector of the default's shape; recall and latency are the usual published ranges, not "
        "measured here:", "",
        "| index | memory per vector | disk per vector | 10M photos | 100M photos | recall@10 (stage 1 alone) | "
        "latency per search (ms) |", "|---|---:|---:|---|---|---|---|"]
    pub = i["published"]
    lines += [
        f"| HNSW (M {i['hnsw_m']}) | {kib(p['stage1']):.1f} KiB + {kib(p['hnsw_graph']):.2f} KiB graph | - | "
        f"{size(ten['stage1_and_graph'])} memory | {size(hun['stage1_and_graph'])} memory | "
        f"{pub['HNSW']['recall_at_10']} | {pub['HNSW']['latency_ms']} |",
        f"| IVF_PQ (m {i['ivf_pq']['m']} x {i['ivf_pq']['bits']} bits, nlist {i['ivf_pq']['nlist']:,}) | "
        f"{p['ivf_pq']} B codes and id (+ the raw vectors in object storage) | - | {size(ten['ivf_pq_memory'])} "
        f"memory | {size(hun['ivf_pq_memory'])} memory | {pub['IVF_PQ']['recall_at_10']} | "
        f"{pub['IVF_PQ']['latency_ms']} |",
        f"| DiskANN (PQ codes {i['diskann']['pq_share']:.3f} of the raw size) | {kib(p['diskann_memory']):.1f} KiB | "
        f"{kib(p['diskann_nvme']):.2f} KiB on NVMe | {size(ten['diskann_memory'])} memory + "
        f"{size(ten['diskann_nvme'])} NVMe | {size(hun['diskann_memory'])} memory + {size(hun['diskann_nvme'])} NVMe "
        f"| {pub['DiskANN']['recall_at_10']} | {pub['DiskANN']['latency_ms']} |"]
    return "\n".join(lines) + "\n"


def block(text: str) -> tuple[int, int]:
    a, b = text.find(BEGIN), text.find(END)
    if a < 0 or b < a:
        sys.exit(f"{PAGE}: holds no {BEGIN} ... {END} block")
    return a + len(BEGIN), b


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="compare docs/milvus.md's block; write nothing")
    a = ap.parse_args(argv)
    r = compute()
    text = PAGE.read_text(encoding="utf-8")
    s, e = block(text)
    new = text[:s] + "\n" + render(INPUTS, r) + text[e:]
    if a.check:
        if new != text:
            print(f"{PAGE.name}: the sizing block is not what benchmarks/milvus_sizing.py computes (run it)")
            return 1
        return 0
    write_json(RESULTS, {"what": "Milvus sizing for vlmatch, computed on paper (nothing measured)", "inputs": INPUTS,
                         **r, "command": "python benchmarks/milvus_sizing.py"})
    if new != text:
        write_text(PAGE, new)
    print(render(INPUTS, r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
