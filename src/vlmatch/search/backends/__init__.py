"""Where an index's collections live: the interface every backend answers (:mod:`.base`), the index folder on
disk (:mod:`.folder`: FAISS and memory-mapped stores, the default) and a Milvus collection set (:mod:`.milvus`).
The builds that write them sit above this package (:mod:`vlmatch.search.build`, :mod:`vlmatch.search.milvus_build`)."""
