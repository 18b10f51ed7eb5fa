"""An index in Milvus (``--backend milvus``): the client and its errors (:mod:`.client`), the collections'
schema (:mod:`.layout`), filters as Milvus expressions (:mod:`.filters`), the server's checks (:mod:`.probe`) and
a committed index opened for search (:mod:`.collection`). Its build is :mod:`vlmatch.search.milvus_build`."""
