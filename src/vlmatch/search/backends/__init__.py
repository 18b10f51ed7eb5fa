"""Where an index's collections live: the interface every backend answers (:mod:`.base`), the index folder on
disk (:mod:`.folder`: FAISS and memory-mapped stores, the default) and a Milvus collection set (:mod:`.milvus`,
its writer included). One builder writes either (:func:`vlmatch.search.build.build_index`)."""
