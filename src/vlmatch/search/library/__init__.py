"""The photo library an index stands for: search by photo (:mod:`.similar`), its near-identical copies
(:mod:`.duplicates`), and which of the files its rows name may be read (:mod:`.trust`). :class:`vlmatch.Index`
offers them; they rank with the index core's :mod:`vlmatch.search.hits`."""
