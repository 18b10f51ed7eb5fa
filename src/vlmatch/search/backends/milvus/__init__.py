"""An index in Milvus (``--backend milvus``): the client and its errors (:mod:`.client`), the collections'
schema (:mod:`.layout`), filters as Milvus expressions (:mod:`.filters`), the server's checks (:mod:`.probe`),
the build and update's writer (:mod:`.build`) and a committed index opened for search (:mod:`.collection`)."""
